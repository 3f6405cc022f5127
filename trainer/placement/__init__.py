"""Where the roles run: device pools per placement mode, the typed spec each worker is given, the
worker groups built on them, the memory they need, and the CPU threads of a local run."""
