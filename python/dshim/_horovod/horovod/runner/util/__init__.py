"""horovod.runner.util: threads (in_thread, on_event, execute_function_multithreaded)."""
