"""What runs inside the workers: the RL math (rlmath/), worker groups (groups/), generation
(rollout/), training (training/), models (models/) and each role's worker (workers/). Never
imports the trainer."""
