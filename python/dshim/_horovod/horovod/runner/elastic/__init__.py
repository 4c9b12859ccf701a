"""Elastic jobs (Horovod's horovod.runner.elastic): what a worker process uses to hear of host
changes (worker.py)."""
