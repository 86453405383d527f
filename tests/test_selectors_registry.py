"""The selector registry carries what evsel knows about each selector (its class's metadata): the
method list and --select's help, which take an argument, which need a model (the daemon's light
asks), which a corpus can stand in for, the settings each reads, and the cleanups of files kept
beside a store. These tests check the registry itself, not copies of it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from evsel.errors import EvselError
from evsel.models.selectors import (BUILTINS, StageSpec, available, check_stage, corpus_first_stages, ingest_hooks,
                                    listing, needs_model, select_help, selectors)
from evsel.settings import Settings


def test_every_builtin_module_registers_one_selector_in_order():
    classes = selectors()
    assert [cls.__module__.rpartition(".")[2] for cls in classes] == list(BUILTINS)
    assert sorted(cls.name for cls in classes) == available()
    assert all(cls.help for cls in classes), "every selector says what it ranks by"


def test_the_listing_names_every_selector_and_every_listed_form_is_a_method():
    names = [name for name, _ in listing()]
    assert len(names) == len(set(names))
    assert {name.split(":")[0] for name in names} == set(available())
    for cls in selectors():
        for form, what in cls.forms:
            assert cls.argument and form.startswith(f"{cls.name}:") and what, form
    for name in names:
        if not any(part.isupper() for part in name.split(":")[1:]):  # not a placeholder (rrf:METHOD)
            check_stage(StageSpec.parse(name))


def test_select_help_names_every_selector_but_no_variant():
    text = select_help()
    assert "--list-methods" in text
    assert all(cls.name in text for cls in selectors())
    assert not any(form in text for cls in selectors() for form, _ in cls.forms)


def test_only_the_selectors_that_declare_an_argument_take_one():
    taking = [cls.name for cls in selectors() if cls.argument]
    assert {"rrf", "qrranker", "blocksearch"} <= set(taking)
    plain = next(cls.name for cls in selectors() if not cls.argument)
    with pytest.raises(EvselError) as caught:
        check_stage(StageSpec.parse(f"{plain}:x"))
    assert f"only {', '.join(taking[:-1])} and {taking[-1]} take an argument" in caught.value.message


@pytest.mark.parametrize("method, needed", [
    ("bm25", False), ("random", False), ("bm25>random", False),
    ("dense", True),  # MiniLM, not the backbone, but a model to load
    ("bm25>qrranker", True), ("rrf:random", True), ("unreal", True),
    ("default", True),  # resolved by the caller first (selectors.default.resolve_select)
    ("nosuch", True), (">", True),  # building it reports why
])
def test_needs_model(method, needed):
    assert needs_model(method) is needed


def test_the_light_selectors_are_exactly_those_needing_no_model():
    for cls in selectors():
        assert needs_model(cls.name) is not cls.light
        assert not (cls.light and cls.needs_model)


def test_corpus_first_stages_are_selectors_without_an_argument():
    stages = corpus_first_stages()
    assert stages and set(stages) <= set(available())
    assert not [cls for cls in selectors() if cls.corpus_first_stage and cls.argument]


def test_corpus_refuses_another_first_stage_naming_those_it_takes():
    from evsel.corpus.query import CorpusStage

    with pytest.raises(EvselError) as caught:
        CorpusStage(None, "random", None)
    stages = sorted(corpus_first_stages())
    assert caught.value.hint.startswith(f"use --select {', '.join(stages[:-1])} or {stages[-1]} with --corpus")


def test_each_selectors_settings_are_settings_fields_and_none_is_claimed_twice():
    known = {f.name for f in fields(Settings)}
    claimed = [name for cls in selectors() for name in cls.settings_fields]
    assert set(claimed) <= known and len(claimed) == len(set(claimed))
    # a Settings field named for a selector is that selector's
    for cls in selectors():
        named = {name for name in known if name.startswith(f"{cls.name}_")}
        assert named <= set(cls.settings_fields), cls.name


def test_ingest_hooks_run_by_their_order_then_the_registrys():
    hooks = ingest_hooks()
    registry = [cls for cls in selectors() if cls in hooks]
    assert hooks and hooks == sorted(registry, key=lambda cls: cls.ingest_order)
    assert hooks[0].name == "dense"  # the cheapest signal joins the default first


def test_importing_the_registry_registers_no_cleanup_and_register_cleanups_does():
    code = ("import evsel.models.selectors as s; s.available(); s.listing(); from evsel.store.store import Store; "
            "before = len(Store._chunk_cleanups); s.register_cleanups(); s.register_cleanups(); "
            "print(before, len(Store._chunk_cleanups))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    wanted = sum(1 for cls in selectors() if "on_chunks_deleted" in vars(cls))
    assert out.split() == ["0", str(wanted)] and wanted >= 2
