"""Horovod's framework-independent core (basics, process sets, exceptions, util) on dshim."""
