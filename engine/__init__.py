"""What runs inside the workers: worker groups (groups/), generation (rollout/), training
(training/), models (models/) and each role's worker (workers/). Never imports the trainer."""
