"""The generated pages (the recipe and command-line references, the migration table) are what the
code renders now: a key, command or option added without regenerating them fails here."""

from __future__ import annotations

from hflow.cli.docs_reference import DOCS, PAGES, REGENERATE, render_cli_reference, render_recipe_reference, stale_pages
from hflow.trainer.config.keys import recipe_keys


def test_committed_pages_match_the_code():
    stale = stale_pages()
    assert not stale, f"docs/{', docs/'.join(stale)} out of date with the code: run `{REGENERATE}` and commit"


def test_a_changed_page_is_found_stale(tmp_path):
    for page, render in PAGES.items():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(render())
    assert stale_pages(tmp_path) == []
    edited = tmp_path / "reference" / "recipe.md"
    edited.write_text(edited.read_text().replace("rollout.n", "rollout.samples", 1))
    (tmp_path / "reference" / "cli.md").unlink()
    assert stale_pages(tmp_path) == ["reference/recipe.md", "reference/cli.md"]
    assert DOCS.name == "docs"


def test_recipe_reference_has_every_key_with_its_default():
    page = render_recipe_reference()
    for key in recipe_keys():
        assert f"**`{key.key}`** · `{key.type}` · " in page, key.key
    assert "**`rollout.n`** · `int` · default `4` · read by: all" in page


def test_cli_reference_has_every_command_and_option():
    page = render_cli_reference()
    for command in ("train", "validate", "init-model", "import-gguf", "eval", "monitor", "runs", "bench", "map",
                    "recipes list", "recipes keys"):
        assert f"## `hflow {command}`" in page or f"### `hflow {command}`" in page, command
    assert "`--set <list[str]>`" in page and "`--resume <path>`" in page
