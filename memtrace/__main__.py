from memtrace.cli import entry

entry()
