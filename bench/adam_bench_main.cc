// Standalone `strata bench adam`, for builds without the daemon's CLI.
#include "bench/adam_bench.h"

int main(int argc, char** argv) { return strata::RunAdamBench(argc, argv); }
