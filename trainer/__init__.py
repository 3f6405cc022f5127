"""The single controller: algorithms (algorithms/), the recipe (config/), the session and
placement (control/), data (data/), the run directory (rundir/), reports (report/), and the
pure RL math (advantages, losses, kl_control, safe_rlhf) at its documented public paths."""
