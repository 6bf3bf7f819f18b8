// The `mc2` command-line tool. Each subcommand registers itself from its own
// file (see commands.h); this file only assembles them and turns command-line
// mistakes into messages that say what to type instead.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "cli_validators.h"
#include "commands.h"

// The build passes project(mc2 VERSION ...) of the top-level CMakeLists.txt.
#ifndef MC2_VERSION
#error "MC2_VERSION must be defined by the build (tools/CMakeLists.txt)"
#endif

namespace {

// When `word` is not a subcommand of `app` but `app` needs one, says so and
// suggests the nearest name (DidYouMean), then returns true.
bool ReportUnknownSubcommand(CLI::App& app, const std::string& path, const std::string& word) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  if (names.empty() || std::find(names.begin(), names.end(), word) != names.end()) return false;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  fmt::print(stderr, "{}: unknown command '{}'{}; the commands are {}\n", path, word,
             mc2::tools::DidYouMean(word, names), list);
  return true;
}

// Checks the subcommand words of argv before CLI11 parses them, so that a
// mistyped command gets its own message instead of CLI11's generic one.
bool CheckSubcommands(CLI::App& app, int argc, char** argv) {
  CLI::App* cur = &app;
  std::string path = "mc2";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return true;  // options: CLI11's job
    CLI::App* sub = nullptr;
    for (CLI::App* s : cur->get_subcommands({}))
      if (s->get_name() == word) sub = s;
    if (sub == nullptr) {
      // Only where a subcommand is required is a plain word a mistyped one.
      if (cur->get_require_subcommand_min() > 0 && ReportUnknownSubcommand(*cur, path, word))
        return false;
      return true;
    }
    cur = sub;
    path += " " + word;
  }
  return true;
}

bool HasArg(int argc, char** argv, std::string_view arg) {
  for (int i = 1; i < argc; ++i)
    if (arg == argv[i]) return true;
  return false;
}

// Options that other tools spell differently, and mc2's name for each
// (docs/cli.md): printed after a parse error that one of them caused.
struct Spelling {
  const char* other;
  const char* mc2;
};
constexpr Spelling kSpellings[] = {
    {"--seq", "--seq-len"},    {"--pipeline", "--pipelines"},  {"--out", "-o/--output"},
    {"--steps", "-i/--iters"}, {"--seconds", "-t/--duration"},
};

void HintSpellings(int argc, char** argv) {
  for (const Spelling& s : kSpellings)
    if (HasArg(argc, argv, s.other))
      fmt::print(stderr, "hint: mc2 spells {} as {} (docs/cli.md)\n", s.other, s.mc2);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mc2: collectives over shared memory", "mc2"};
  app.set_version_flag("-V,--version", "mc2 " MC2_VERSION);
  app.require_subcommand(1);
  mc2::tools::RegisterRun(app);
  mc2::tools::RegisterBench(app);
  mc2::tools::RegisterTrace(app);
  mc2::tools::RegisterSoak(app);
  mc2::tools::RegisterDemo(app);
  mc2::tools::RegisterTopo(app);
  if (!CheckSubcommands(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // A subcommand's own failure: it has already explained itself.
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // Help and --version exit 0; real parse errors are usage errors (2),
    // not CLI11's own numbering.
    const int status = app.exit(e);
    if (status != 0 && HasArg(argc, argv, "-np"))
      fmt::print(stderr,
                 "hint: mc2 takes -n N (or --nranks N) for the number of ranks, not "
                 "mpirun's -np\n");
    if (status != 0) HintSpellings(argc, argv);
    return status == 0 ? 0 : 2;
  }
  return 0;
}
