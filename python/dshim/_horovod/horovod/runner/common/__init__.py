"""Horovod's launcher helpers shared by its launch modes (host parsing and placement)."""
