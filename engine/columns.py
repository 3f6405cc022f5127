"""The column contract: every column a step's Batch may carry, written down once.

Workers and the controller name columns through these constants, never as string
literals. Shapes use N rows (prompts x `rollout.n`; rows of one prompt are adjacent),
P the widest prompt and R the widest response of the batch (at least 1). Tensors are
padded (prompt on the left, response on the right); per-token float columns are zero past
each response's end. "Columns" without a shape are Python lists of N entries
(`Batch.columns`). Batch meta keys (`step`, `greedy`, `eval`) are not columns.
"""

# --- prompts, from the data (`trainer/data/prompts.py`) -------------------------------------

PROMPT = "prompt"
"""list, N: the prompt as the data set has it (text, or a list of chat messages)."""

PROMPT_IDS = "prompt_ids"
"""list, N: the prompt's token ids, unpadded (chat prompts through the chat template)."""

UID = "uid"
"""list, N: the prompt's group id; the n responses to one prompt share it (GRPO's groups)."""

# --- rollout, from the actor's generation (`engine/rollout/assembly.py`) --------------------

INPUT_IDS = "input_ids"
"""(N, P + R) long: prompt + response token ids."""

ATTENTION_MASK = "attention_mask"
"""(N, P + R) long: 1 on real tokens (a multi-turn episode's environment tokens too), 0 on padding."""

POSITION_IDS = "position_ids"
"""(N, P + R) long: positions counted from the first real token (padding gets 0)."""

RESPONSES = "responses"
"""(N, R) long: the response tokens alone (padding is the pad token id)."""

RESPONSE_MASK = "response_mask"
"""(N, R) long: 1 on the tokens trained on: the sampled response tokens up to and including the
stop token. In a multi-turn episode the environment's observation tokens between the turns are 0
(gaps): a response's length is its attention mask's, not this mask's sum."""

ROLLOUT_LOG_PROBS = "rollout_log_probs"
"""(N, R) float: the sampler's log-prob of each response token (at the sampling temperature)."""

ROLLOUT_ENTROPY = "rollout_entropy"
"""(N, R) float: the sampler's entropy at each response token (hf engine)."""

POLICY_VERSION = "policy_version"
"""(N,) long: the policy version that generated the row (the steps trained before its weights were
copied): in `trainer.mode: async` the generator's (`engine/rollout/generator_copy.py`), in sync mode
step - 1, stamped by the controller's stream (`trainer/streaming/chunks.py`)."""

EPISODE = "episode"
"""list, N: a multi-turn episode's record (`rollout.env`; `engine/rollout/episodes.py`): a dict
with `return` (the sequence's score under `reward.function: env`), `turns` (per turn: the
assistant's text, the observation, reward, timings), `ended` and `tool_calls`."""

RESPONSE_TEXT = "response_text"
"""list, N: the decoded response (written by the reward worker)."""

# --- scores of the rollout ------------------------------------------------------------------

OLD_LOG_PROBS = "old_log_probs"
"""(N, R) float: the policy's log-probs before this step's update (the PPO ratio's denominator)."""

ENTROPY = "entropy"
"""(N, R) float: the policy's entropy at each response token, before the update."""

REF_LOG_PROBS = "ref_log_probs"
"""(N, R) float: the frozen reference policy's log-probs (the KL term)."""

SCORES = "scores"
"""(N,) float: the reward of each response (a reward model's score or a function's)."""

OVERLONG_PENALTY = "overlong_penalty"
"""(N,) float: DAPO's overlong penalty (<= 0), already added to `SCORES` (`engine/rlmath/dapo.py`)."""

COSTS = "costs"
"""(N,) float: Safe-RLHF's cost of each response (positive = unsafe)."""

VALUES = "values"
"""(N, R) float: the critic's V(s_t) before each response token, before its update."""

COST_VALUES = "cost_values"
"""(N, R) float: Safe-RLHF's cost critic's values, like `VALUES`."""

# --- the controller's advantage stage -------------------------------------------------------

TOKEN_REWARDS = "token_rewards"
"""(N, R) float: per-token rewards (the score on the last token, minus the KL penalty)."""

TOKEN_COSTS = "token_costs"
"""(N, R) float: Safe-RLHF's per-token costs, like `TOKEN_REWARDS`."""

ADVANTAGES = "advantages"
"""(N, R) or (N,) float: what the policy loss weights each token (a row's value for every token)."""

RETURNS = "returns"
"""(N, R) float: the critic's targets."""

COST_RETURNS = "cost_returns"
"""(N, R) float: the cost critic's targets."""

# --- PPO-ptx (`trainer/data/ptx.py`) --------------------------------------------------------

PTX_INPUT_IDS = "ptx_input_ids"
"""(N, L) long: pretraining text for the language-modelling loss, one row per sequence."""

PTX_ATTENTION_MASK = "ptx_attention_mask"
"""(N, L) long: its attention mask."""

# --- row timings (`trainer/streaming/chunks.py`) --------------------------------------------

GENERATED_AT = "generated_at"
"""(N,) float64: wall-clock time (Unix seconds) at which the row's generation call returned it."""

REWARD_STARTED_AT = "reward_started_at"
"""(N,) float64: wall-clock time at which the reward stage started on the row's chunk."""
