"""The RL math: pure functions on tensors, each registered by name (`registry.py`).

    advantages.py     advantage estimators (GRPO, RLOO, REINFORCE++, GAE, ReMax) and whitening
    policy_losses.py  policy losses (PPO, GSPO, CISPO), the actor's objective
    aggregation.py    from per-token losses to one scalar (token-mean, seq-mean-*)
    off_policy.py     importance weights for a sampler that is not the trained policy
    kl.py             KL estimators, the KL charged in the reward, KL coefficient controllers
    value.py          the critic's loss and its explained variance
    safe_rlhf.py      Safe-RLHF's Lagrange multiplier and combined advantage
    dapo.py           DAPO's overlong shaping and group filter

Nothing here touches a model, a worker or a recipe: the engine's workers and the trainer's
algorithm programs both import it, and a user can test any of it as a function.
"""
