"""The single controller: algorithms (algorithms/), the recipe (config/), the run's lifecycle
(control/), where the roles run (placement/), streamed and asynchronous rollouts (streaming/),
the step's work account (work/), data (data/), the run directory (rundir/), reports (report/) and
the Python API (api/). The RL math it calls is the engine's (`engine/rlmath/`)."""
