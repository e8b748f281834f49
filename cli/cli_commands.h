// The `strata` CLI's subcommands. Each takes the arguments after its own name
// (argv[0] is the subcommand) and returns the process exit status:
// 0 success, 1 a runtime failure, 2 bad usage (one line on stderr naming the
// flag and what is accepted).
#ifndef STRATA_CLI_CLI_COMMANDS_H_
#define STRATA_CLI_CLI_COMMANDS_H_

namespace strata {

int RunPlanCommand(int argc, char** argv);
int RunStatusCommand(int argc, char** argv);
int RunJobsCommand(int argc, char** argv);
int RunStatsCommand(int argc, char** argv);
int RunDrainCommand(int argc, char** argv);
int RunParkCommand(int argc, char** argv);
int RunResumeCommand(int argc, char** argv);
int RunCheckpointCommand(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_CLI_CLI_COMMANDS_H_
