// The subcommands of the `mc2` command-line tool. Each lives in its own
// tools/<name>_command.cc and is added to the app by its Register function,
// called from main.cc.
//
// Convention: a subcommand's callback reports a non-zero exit status by
// throwing CLI::RuntimeError(status); main() turns it into the process exit
// status without printing anything more (the command prints its own
// diagnostics). Command-line parse errors exit with status 2.
//
// One vocabulary across the subcommands (docs/cli.md lists every option):
// -n/--nranks the number of ranks launched, -d/--dtype the element type,
// --op the reduction, -i/--iters and -w/--warmup timed and untimed
// iterations (warm-up may be 0), -o/--output what a command writes (a file,
// or a demo's directory), --json FILE the results as JSON ("-": standard
// output), --pipelines the fused operators' pipelines, --splits their chunk
// count, --seq-len tokens per sequence, --check a flag that turns failed
// checks into exit status 1; sizes and durations take core::ParseBytes' and
// core::ParseDuration's forms (cli_validators.h); outputs are checked before
// any work and directories are never emptied (output_paths.h).
#ifndef MC2_TOOLS_COMMANDS_H_
#define MC2_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace mc2::tools {

// `mc2 run -n N [--no-prefix] [--heap BYTES] [--] PROGRAM [ARGS...]`, and
// `mc2 run --hosts a:2,b:2 [--mpirun-args ARGS] PROGRAM [ARGS...]` (hosts_launch.h)
void RegisterRun(CLI::App& app);
// `mc2 bench COLLECTIVE -n N -b MIN -e MAX ...` and `mc2 bench --tune`
void RegisterBench(CLI::App& app);
// `mc2 bench ops --operator OP -m M -k K -N N ...` and `mc2 bench ops --tune`,
// a subcommand of `bench` (tools/bench_ops.cc)
void RegisterBenchOps(CLI::App& bench);
// `mc2 bench batch [-n N] [--entries E] [--bytes B] ...`: a batch of
// collectives against separate calls, a subcommand of `bench` (tools/bench_batch.cc)
void RegisterBenchBatch(CLI::App& bench);
// `mc2 trace merge DIR -o FILE`, `mc2 trace report DIR [--json FILE] [--check]`,
// `mc2 trace plot DIR [-o FILE.svg]`
void RegisterTrace(CLI::App& app);
// `mc2 soak -n N -t DURATION [--faults] [--seed X]` (soak.h)
void RegisterSoak(CLI::App& app);
// `mc2 demo [-n N] [--link auto|none|SPEC] [--pipelines ...]` (demo_command.cc)
void RegisterDemo(CLI::App& app);
// `mc2 demo infer [-n N] [--tp T] [--batch B] [--prompt-len P] [--new-tokens K] ...`,
// a subcommand of `demo` (demo_infer.cc)
void RegisterDemoInfer(CLI::App& demo);
// `mc2 demo fsdp [-n N] [--prefetch 0,1,2] [--link auto] ...`, a subcommand of
// `demo` (demo_fsdp.cc)
void RegisterDemoFsdp(CLI::App& demo);
// `mc2 demo pp [-n N] [--pp P] [--tp T] [--dp D] [--micro-batches M] [--schedules ...] ...`,
// a subcommand of `demo` (demo_pp.cc)
void RegisterDemoPp(CLI::App& demo);
// `mc2 demo cp [-n N] [--cp C] [--tp T] [--seq-len S] [--overlap on|off|both] ...`, a
// subcommand of `demo` (demo_cp.cc)
void RegisterDemoCp(CLI::App& demo);
// `mc2 topo [-n N] [--json FILE]`: hosts, ranks, cores and links (topo_command.cc)
void RegisterTopo(CLI::App& app);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_COMMANDS_H_
