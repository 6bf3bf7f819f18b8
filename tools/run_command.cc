// `mc2 run`: the command-line front end of the launcher (launcher.h).
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli_validators.h"
#include "commands.h"
#include "core/env.h"
#include "launcher.h"
#include "mc2/error.h"

namespace mc2::tools {

void RegisterRun(CLI::App& app) {
  // Owned by the callback, which outlives this function.
  struct State {
    LaunchOptions options;
    std::string heap;
  };
  auto state = std::make_shared<State>();
  CLI::App* run =
      app.add_subcommand("run", "Run N ranks of PROGRAM on this host with shared memory");
  run->add_option("-n,--nranks", state->options.nranks, "Number of ranks")
      ->required()
      ->check(CLI::Range(1, 256));
  run->add_flag("!--no-prefix", state->options.prefix_output,
                "Pass the ranks' output through unchanged instead of "
                "prefixing each line with \"[rank] \"");
  run->add_option("--bind", state->options.bind,
                  "Where each rank binds its threads (sets MC2_BIND): core (a slice of the "
                  "cores), socket, numa, none, or auto (core when the ranks' threads fill "
                  "the cores); docs/topology.md")
      ->check(CLI::IsMember({"auto", "none", "core", "socket", "numa"}));
  run->add_option("--heap", state->heap,
                  "Shared heap bytes per rank, e.g. 268435456 or 512M "
                  "(default: $MC2_HEAP_BYTES, else 256M)")
      ->check(BytesValidator(1));
  run->add_option("program", state->options.argv,
                  "PROGRAM [ARGS...]: everything from PROGRAM on is passed to "
                  "the ranks unparsed")
      ->required();
  // Once PROGRAM is seen, every later argument belongs to it, even if it
  // looks like one of our options (`mc2 run -n 2 prog -n 5`).
  run->positionals_at_end();
  run->callback([state] {
    LaunchOptions& options = state->options;
    // The option's validator has checked the form and that it is positive.
    if (!state->heap.empty()) options.heap_bytes = core::ParseBytes(state->heap, "--heap");
    const int status = RunLaunch(options);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace mc2::tools
