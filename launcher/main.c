/* dshim-run: entry point.  Options -> plan -> controller, with restarts;
 * or, when started by a controller, the agent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "run.h"
#include "timeline.h"

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--agent") == 0) {
        return run_agent_main(false);
    }
    if (argc == 2 && strcmp(argv[1], "--agent-rank") == 0) {
        return run_agent_main(true);
    }
    if (dshim_config_check() != DSHIM_OK) {
        run_usage_error("%s", dshim_last_error());
    }
    run_opts_t opts;
    run_parse_options(argc, argv, &opts);
    if (opts.sync_dst_dir && !opts.dry_run) {
        char cwd[4096];
        if (getcwd(cwd, sizeof(cwd)) == NULL || run_sync_dirs(&opts, cwd, opts.sync_dst_dir) != 0) {
            return RUN_EXIT_USAGE;
        }
    }
    for (int attempt = 0;; attempt++) {
        run_plan_t plan;
        run_build_plan(&opts, &plan, attempt);
        run_timeline_plan(&opts, &plan);
        if (opts.dry_run) {
            run_print_plan(&opts, &plan);
            run_free_plan(&plan);
            return 0;
        }
        bool failed = false;
        int code = run_controller(&opts, &plan, &failed);
        run_free_plan(&plan);
        if (code == 0 || !failed || attempt >= opts.max_restarts) {
            return code;
        }
        run_say("restarting the job (restart %d of %d)", attempt + 1, opts.max_restarts);
    }
}
