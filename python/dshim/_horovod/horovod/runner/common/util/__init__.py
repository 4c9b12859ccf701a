"""horovod.runner.common.util: hosts (parsing and Horovod's rank placement), env (a rank's identity)."""
