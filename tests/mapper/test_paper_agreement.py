"""The mapper's choices against the HybridFlow paper's published findings.

Sources (Sheng et al., EuroSys 2025, arXiv 2409.19256): Section 8.3 and Figure 12 (placements of
13B and 34B PPO on 16-128 A100-80GB), Section 9 (insights), Figure 14 (the actor's training and
generation parallel sizes). Where the model disagrees the test pins the documented behaviour and
docs/auto-mapper.md explains why.
"""

import pytest

COLOCATE = [["actor", "reference", "critic", "reward"]]


def _set_of(plan, role):
    return next(i for i, group in enumerate(plan.placement) if role in group)


@pytest.mark.parametrize("name, gpus", [
    ("llama2-7b", 8), ("llama2-7b", 16), ("llama2-7b", 32), ("llama2-7b", 64),
    ("llama2-13b", 16), ("llama2-13b", 32), ("llama2-13b", 64),
    ("codellama-34b", 32), ("codellama-34b", 64), ("llama2-70b", 64),
])
def test_colocating_every_model_is_best_up_to_64_gpus(paper_search, name, gpus):
    # Section 8.3 (paraphrased): from 16 to 64 GPUs, colocating all models on one set of devices
    # performs best -- every GPU is busy in every stage.
    assert paper_search(name, gpus).best.placement == COLOCATE


@pytest.mark.parametrize("name, gpus", [("codellama-34b", 96), ("codellama-34b", 128),
                                        ("llama2-70b", 96), ("llama2-70b", 128)])
def test_large_models_at_scale_train_actor_and_critic_apart_on_even_halves(paper_search, name, gpus):
    # Section 8.3: for 34B on 96-128 GPUs the split strategy is best, dividing the GPUs evenly;
    # Section 9: at scale, actor and critic on different devices train in parallel.
    best = paper_search(name, gpus).best
    assert len(best.sets) == 2
    assert _set_of(best, "actor") != _set_of(best, "critic")
    assert [s.devices for s in best.sets] == [gpus // 2, gpus // 2]


def test_the_papers_split_is_within_two_percent_of_the_choice_for_34b(paper_search):
    # The paper's split is actor+reference | critic+reward; the model prefers moving the reward
    # model next to the actor (as the paper's own Figure 13 plan does at 128 GPUs) by a hair.
    for gpus in (96, 128):
        result = paper_search("codellama-34b", gpus)
        split = next(p for p in result.ranked
                     if sorted(map(sorted, p.placement)) == [["actor", "reference"], ["critic", "reward"]])
        assert split.iteration_s <= 1.02 * result.best.iteration_s


def test_13b_at_96_and_128_gpus_disagrees_and_why(paper_search):
    # The paper finds split best at 96 GPUs and standalone at 128 for 13B; the model keeps
    # colocating, with the actor/critic splits close behind. Pinning the actor's and critic's
    # training to the paper's sizes for 13B (Figure 14: T=8, P=1, so DP grows with the cluster)
    # brings the data-parallel gradient traffic over the 200 Gbit/s network back, and with it the
    # paper's conclusion at 128 GPUs. See docs/auto-mapper.md.
    for gpus in (96, 128):
        result = paper_search("llama2-13b", gpus)
        assert result.best.placement == COLOCATE
        apart = [p for p in result.ranked if _set_of(p, "actor") != _set_of(p, "critic")]
        assert apart[0].iteration_s <= 1.10 * result.best.iteration_s
    pinned = paper_search("llama2-13b", 128, train_layout=(8, 1)).best
    assert _set_of(pinned, "actor") != _set_of(pinned, "critic")


@pytest.mark.parametrize("name, gpus, train, gen_tp", [
    ("codellama-34b", 32, (8, 4), 8),  # Figure 14c: T=8, P=4, T_g=8
    ("llama2-70b", 64, (8, 8), 8),     # Figure 14d: T=8, P=8, T_g=8
])
def test_actor_parallel_sizes_match_figure_14_for_large_models(paper_search, name, gpus, train, gen_tp):
    actor = next(m for s in paper_search(name, gpus).best.sets for m in s.models if m.role == "actor")
    assert (actor.strategy["train"]["tp"], actor.strategy["train"]["pp"]) == train
    assert actor.strategy["generate"]["tp"] == gen_tp


def test_70b_transition_time_is_the_papers_order_of_magnitude(paper_search):
    # Section 8.4: HybridFlow cut the 70B transition by 78.2 s, 89.1%: about 9.6 s remain. The
    # model's all-gather within micro-DP groups of 8 ranks across nodes at 200 Gbit/s:
    actor = next(m for s in paper_search("llama2-70b", 64).best.sets for m in s.models if m.role == "actor")
    assert 2.0 <= actor.detail["reshard_s"] <= 20.0
