"""``json_size`` is the size of the JSON the orchestrator would hold, exactly, without building
it (the chat-history budget is checked with it)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_omni.pipeline.json_size import json_size

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # what a body parses to
ASCII = st.text(st.characters(max_codepoint=0x7F), max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT | ASCII
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(TEXT | ASCII, inner, max_size=4), max_leaves=30)


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(VALUES)
def test_json_size_is_the_size_of_the_json(value: Any) -> None:
    assert json_size(value) == len(json.dumps(value, ensure_ascii=False).encode())


def test_a_base64_history_of_megabytes_is_measured_exactly() -> None:
    payload = "QUJD" * 1_000_000 + "\n\"\\\x01"
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{payload}"}},
        {"type": "text", "text": "d\u00e9cris \U0001f600"}], "n": (1, 2.5, None)}]
    assert json_size(messages) == len(json.dumps(messages, ensure_ascii=False).encode())
