/*
 * The per-job directory (torch's error files, --timeline part files, the
 * flight-recorder dumps, the mpirun host file): private and unpredictable,
 * as torchrun's tempfile.mkdtemp.  The controller makes it
 * ($TMPDIR/dshim-run.XXXXXX) and passes its name to every agent in the job
 * description (spec.h), never derived from a pid that another user could
 * guess and make first.  An agent on another host claims the same name;
 * where it cannot (someone made it first, no such TMPDIR there) it makes a
 * fresh one and rewrites the paths of its processes to it.
 */
#ifndef DSHIM_RUN_JOBDIR_H
#define DSHIM_RUN_JOBDIR_H

#include "spec.h"

/* Controller: the directory of this attempt (malloc'ed), made unless dry_run;
 * removed at exit when still empty (a usage error before the job started). */
char *run_jobdir_make(bool dry_run);
/* Agent: makes spec->jobdir usable on this host (see above); 0, or -1 with a message in err. */
int run_jobdir_claim(run_spec_t *spec, char *err, size_t errlen);
/* Agent: the directory claimed here; NULL before (or without) one. */
const char *run_jobdir_here(void);
/* path lies inside dir ("dir/..."). */
bool run_path_under(const char *path, const char *dir);

#endif
