// The `mc2` command-line tool. Each subcommand registers itself from its own
// file (see commands.h); this file only assembles them.
#include <CLI/CLI.hpp>

#include "commands.h"

// The build may pass the project version; this fallback matches
// project(mc2 VERSION ...) in the top-level CMakeLists.txt.
#ifndef MC2_VERSION
#define MC2_VERSION "0.1.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"mc2: collectives over shared memory", "mc2"};
  app.set_version_flag("--version", "mc2 " MC2_VERSION);
  app.require_subcommand(1);
  mc2::tools::RegisterRun(app);
  mc2::tools::RegisterBench(app);
  mc2::tools::RegisterTrace(app);
  mc2::tools::RegisterSoak(app);
  mc2::tools::RegisterDemo(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // A subcommand's own failure: it has already explained itself.
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // Help and --version exit 0; real parse errors are usage errors (2),
    // not CLI11's own numbering.
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  return 0;
}
