"""The tokens prompts all begin with (engine/prompt_prefix.py), on hand-written prompts."""

import torch

from hflow.engine.prompt_prefix import already_begun, common_prefix, common_prefix_of, trie_size


def test_the_common_prefix_stops_at_the_first_difference_and_leaves_each_prompt_a_token():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 5]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter keeps its last token
    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix([[7, 2], [1, 2]]) == 0
    assert common_prefix([[1, 2, 3]]) == 0  # one prompt shares with nobody
    assert common_prefix([[1], [1, 2]]) == 0


def test_left_padded_prompts_give_the_same_prefix():
    rows = [[1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 3]]
    width = 6
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row):], mask[r, width - len(row):] = torch.tensor(row), 1
    assert common_prefix_of(ids, mask) == common_prefix(rows) == 2
    ids[1, 2] = 7  # the second prompt's second token
    assert common_prefix_of(ids, mask) == 1
    assert common_prefix_of(ids[:1], mask[:1]) == 0


def test_already_begun_counts_the_prompts_trie():
    prompts = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9], [7, 8]]
    begun, rank = already_begun(prompts)
    # sorted: [1,2,3,4], [1,2,3,9], [1,2,5], [7,8]: 0, 3, 2, 0 tokens shared with the one before
    assert begun == [0, 2, 3, 0] and rank == [0, 2, 1, 3]
    # trie nodes: 1-2-3-4, 3-9, 2-5, 7-8 = 4 + 1 + 1 + 2
    assert sum(len(p) - b for p, b in zip(prompts, begun)) == 8
    lengths = [len(p) for p in prompts]
    assert trie_size(lengths, begun, rank, [True] * 4) == 8
    assert trie_size(lengths, begun, rank, [True, True, False, False]) == 4 + 1  # [1,2,3,4] and [1,2,5]: 1-2-3-4, 5
    assert trie_size(lengths, begun, rank, [False, True, False, True]) == 3 + 2
    assert trie_size(lengths, begun, rank, [False] * 4) == 0
    assert already_begun([[5]]) == ([0], [0])
