"""Episode metrics and samples, from hand-made episode records."""

from hflow.trainer.control.episode_stats import episode_metrics, episode_sample

EPISODES = [
    {"return": 1.0, "ended": "done", "tool_calls": 1,
     "turns": [{"assistant": "=", "observation": [{"role": "tool", "content": "6"}], "reward": 0.2,
                "tokens": 1, "generate_s": 0.5, "env_s": 0.1},
               {"assistant": "66", "observation": [], "reward": 0.8, "tokens": 2, "generate_s": 0.25, "env_s": 0.3}]},
    {"return": 0.0, "ended": "max_tokens", "tool_calls": 0,
     "turns": [{"assistant": "x", "observation": [], "reward": 0.0, "tokens": 1, "generate_s": 0.5, "env_s": 0.2}]},
]


def test_episode_metrics_by_hand():
    m = episode_metrics(EPISODES)
    assert m["episode/turns_mean"] == 1.5 and m["episode/return_mean"] == 0.5
    assert m["episode/ended_done"] == 0.5 and m["episode/ended_max_tokens"] == 0.5 and m["episode/ended_timeout"] == 0
    assert m["episode/tool_call_share"] == 0.5 and m["episode/tool_calls_mean"] == 0.5
    assert (m["episode/turn1_live"], m["episode/turn1_generate_s"]) == (2.0, 0.5)
    assert abs(m["episode/turn1_env_s"] - 0.15) < 1e-12
    assert (m["episode/turn2_live"], m["episode/turn2_generate_s"], m["episode/turn2_env_s"]) == (1.0, 0.25, 0.3)


def test_a_sample_shows_the_episode_turn_by_turn():
    sample = episode_sample(EPISODES[0])
    assert [t["assistant"] for t in sample["turns"]] == ["=", "66"]
    assert sample["turns"][0]["observation"] == [{"role": "tool", "content": "6"}]
    assert (sample["ended"], sample["return"], sample["tool_calls"]) == ("done", 1.0, 1)
