"""Reading answers: fence spellings, CRLF, drafts and other-language blocks, thinking sections,
truncated and empty answers; and what the model is told about each, through the real SDKs."""
from __future__ import annotations

import pytest

from metal_accel.core.errors import CandidateFormatError
from metal_accel.synth.answers import AnswerProblem, candidate_code, read_answer
from metal_accel.synth.clients import make_client
from metal_accel.synth.models import parse_model

from llm_server import Reply
from synth_harness import FAST, candidate, llm, run_loop  # noqa: F401 (llm: fixture)

pytest.importorskip("openai")
pytest.importorskip("anthropic")


def block(tag: str, fence: str = "```python") -> str:
    return f'{fence}\nSOURCE = r"""// {tag}"""\n\ndef forward(module, x):\n    return x\n```\n'


@pytest.mark.parametrize("fence", ["```python", "```Python", "```python3", "``` python", "```py", "```", "~~~python",
                                   "```PYTHON ", "````python"])
def test_any_fence_spelling(fence):
    text = candidate("GOOD", fence=fence)
    if fence.startswith("~~~"):
        text = text.replace("```\n", "~~~\n")
    if fence.startswith("````"):
        text = text.replace("\n```\n", "\n````\n")
    cand = read_answer(text, "cpu")
    assert "// GOOD" in cand.source and cand.code.startswith("SOURCE")


def test_crlf_and_cr_line_endings():
    for newline in ("\r\n", "\r"):
        cand = read_answer(candidate("GOOD", newline=newline), "cpu")
        assert "\r" not in cand.code and "// GOOD" in cand.source


def test_other_language_blocks_before_the_answer_do_not_hide_it():
    kernel = "```cpp\nextern \"C\" void k() {}\n```\n\n```metal\nkernel void k() {}\n```\n"
    assert "// GOOD" in read_answer("The kernel:\n" + kernel + "And the candidate:\n" + block("GOOD"), "cpu").source


def test_draft_then_final_takes_the_final_block():
    text = "Draft:\n" + block("DRAFT") + "\nOn reflection, better:\n" + block("FINAL", "```py")
    assert "// FINAL" in read_answer(text, "cpu").source


def test_final_block_with_a_syntax_error_is_reported_not_passed_over_for_the_draft():
    broken = block("FINAL").replace("return x", "return x)")
    with pytest.raises(CandidateFormatError, match="not valid Python"):
        read_answer(block("DRAFT") + broken, "cpu")


@pytest.mark.parametrize("wrap", [
    "<think>Let me draft:\n{draft}\nHmm.</think>\n{final}",
    "<thinking>\n{draft}\n</thinking>\n\n{final}",
    "<THINK>{draft}</THINK>{final}",
    "I think first:\n{draft}\n</think>\n{final}",     # a server that strips the opening tag
    "\u25c1think\u25b7{draft}\u25c1/think\u25b7{final}",
])
def test_thinking_sections_are_ignored(wrap):
    text = wrap.format(draft=block("DRAFT"), final=block("FINAL").replace("// FINAL", "// GOOD"))
    assert "// GOOD" in read_answer(text, "cpu").source


def test_only_a_draft_inside_thinking_is_not_taken():
    with pytest.raises(AnswerProblem) as err:
        read_answer("<think>" + block("DRAFT") + "</think>\n\nDone.", "cpu")
    assert err.value.kind == "malformed"


@pytest.mark.parametrize("text, truncated, kind", [
    ("", False, "empty"),
    ("  \r\n ", False, "empty"),
    ("", True, "truncated"),
    ("<think>long reasoning that never ends", True, "truncated"),
    ("<think>long reasoning that never ends", False, "thinking-only"),
    ("<think>all thought</think>\n", False, "thinking-only"),
    ("Here:\n```python\nSOURCE = r\"\"\"// half a kernel", False, "truncated"),   # unclosed block
    ("Here:\n```python\nSOURCE = r\"\"\"// half a kernel", True, "truncated"),
    ("Let me explain the approach at length", True, "truncated"),
    ("Sorry, I cannot write kernels today.", False, "malformed"),
    ("```cpp\nextern \"C\" void k() {}\n```\n", False, "malformed"),
])
def test_answers_without_a_candidate_say_why(text, truncated, kind):
    with pytest.raises(AnswerProblem) as err:
        candidate_code(text, truncated=truncated)
    assert err.value.kind == kind, err.value
    if kind == "malformed" and "cpp" in text:
        assert "cpp" in str(err.value)


def test_bare_code_without_fences_is_still_read():
    code = 'SOURCE = r"""// GOOD"""\n\ndef forward(module, x):\n    return x\n'
    assert "// GOOD" in read_answer(code, "cpu").source


def test_a_complete_block_counts_even_when_the_answer_ran_on_to_the_limit():
    assert "// GOOD" in read_answer(block("GOOD") + "\nSome further notes that were cut", "cpu", truncated=True).source


# --- through the SDKs: finish reasons, what the model is told, reasoning budgets -------------------------------

@pytest.mark.parametrize("model, finish", [("openai:gpt-4o", "length"), ("anthropic:claude-test", "max_tokens")])
def test_truncated_answer_is_told_as_such_and_never_as_invalid_python(llm, model, finish):
    name = model.split(":")[1]
    cut = "Sure.\n```python\nSOURCE = r\"\"\"\nextern \"C\" void k("
    server = llm({name: [Reply(cut, finish=finish), candidate("GOOD")]})
    loop, evaluated = run_loop([model])
    assert [e.verdict.accepted for e in evaluated] == [True]
    first, second = loop.records[0].attempts
    assert first.outcome.startswith("truncated answer") and "invalid" not in first.outcome
    sent = server.requests[1]
    roles = [m["role"] for m in sent.messages if m["role"] != "system"]
    assert roles == ["user"]  # no cut-off assistant turn
    note = sent.last_user()
    assert "cut off at the output limit of 8192 tokens" in note and "not valid Python" not in note
    assert note.startswith(server.requests[0].last_user())  # the task, with the note after it


def test_reasoning_that_eats_the_budget_is_named(llm):
    server = llm({"o3": [Reply("", finish="length", usage=(1000, 24576), reasoning_tokens=24576), candidate("GOOD")]})
    loop, evaluated = run_loop(["openai:o3"])
    assert evaluated and evaluated[0].verdict.accepted
    note = server.requests[1].last_user()
    assert "output limit of 24576 tokens (24576 of them on reasoning)" in note
    assert loop.records[0].attempts[0].outcome.startswith("truncated answer")


@pytest.mark.parametrize("model", ["openai:gpt-4o", "anthropic:claude-test"])
def test_empty_answer_is_never_sent_back_as_an_empty_turn(llm, model):
    name = model.split(":")[1]
    server = llm({name: ["", "<think>only thoughts</think>", candidate("GOOD")]})
    loop, evaluated = run_loop([model])
    assert evaluated and evaluated[0].verdict.accepted
    for req in server.requests:
        assert all(m.get("content") for m in req.messages), req.messages
        assert [m["role"] for m in req.messages if m["role"] != "system"] == ["user"]
    assert "Your previous reply was empty" in server.requests[1].last_user()
    third = server.requests[2].last_user()
    assert "held only a thinking section" in third and "was empty" not in third  # one note, the latest
    assert [a.outcome.split(":")[0] for a in loop.records[0].attempts] == ["empty answer", "empty answer", "accepted"]


def test_malformed_then_draft_and_final_in_one_conversation(llm):
    mixed = "<think>" + block("BAD") + "</think>\n```cpp\nint k;\n```\n" + block("BAD") + \
        candidate("GOOD", fence="```Python", newline="\r\n")
    server = llm({"gpt-4o": ["No code, sorry.", mixed]})
    loop, evaluated = run_loop(["openai:gpt-4o"])
    assert [e.verdict.accepted for e in evaluated] == [True]
    assert "no ```python block defining SOURCE and forward" in server.requests[1].last_user()
    assert [m["role"] for m in server.requests[1].messages][-2:] == ["assistant", "user"]


def _args(model: str, **settings) -> dict:
    client = make_client(parse_model(model), FAST.with_(**settings))
    return client.request_args("sys", [{"role": "user", "content": "u"}])


def test_reasoning_budgets_per_provider(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-x")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-x")
    assert _args("openai:gpt-4o", temperature=0.2)["max_completion_tokens"] == 8192
    assert _args("openai:gpt-4o", temperature=0.2)["temperature"] == 0.2
    o3 = _args("openai:o3", reasoning_effort="high", temperature=0.2)
    assert o3["max_completion_tokens"] == 8192 + 16384 and o3["reasoning_effort"] == "high"
    assert "temperature" not in o3  # reasoning models take only the default
    assert _args("openai:gpt-5-mini", reasoning_tokens=4000)["max_completion_tokens"] == 12192
    assert _args("openai:gpt-5-mini", reasoning_tokens=0)["max_completion_tokens"] == 8192
    plain = _args("anthropic:claude-sonnet-4-5")
    assert plain["max_tokens"] == 8192 and "thinking" not in plain
    thinking = _args("anthropic:claude-sonnet-4-5", thinking="enabled", reasoning_tokens=10000, temperature=0.3)
    assert thinking["thinking"] == {"type": "enabled", "budget_tokens": 10000}
    assert thinking["max_tokens"] == 18192 and "temperature" not in thinking  # the answer keeps its 8192
    assert _args("anthropic:claude-opus-4-5", thinking="adaptive")["thinking"] == {"type": "adaptive"}
    local = "openai-compatible:http://127.0.0.1:9/v1#deepseek-r1:14b"
    assert _args(local)["max_tokens"] == 8192
    assert _args(local, reasoning_models=("deepseek-r1*",))["max_tokens"] == 8192 + 16384


def test_reasoning_settings_from_the_environment(monkeypatch):
    from metal_accel.synth.settings import SynthSettings
    monkeypatch.setenv("METAL_ACCEL_REASONING_TOKENS", "2048")
    monkeypatch.setenv("METAL_ACCEL_ANSWER_TOKENS", "4096")
    monkeypatch.setenv("METAL_ACCEL_THINKING", "enabled")
    monkeypatch.setenv("METAL_ACCEL_REASONING_MODELS", "qwen3*, my-r1")
    s = SynthSettings.from_env()
    assert s.output_budget("anthropic", "claude-x") == 6144 and s.output_budget("openai-compatible", "qwen3:8b") == 6144
    assert s.output_budget("openai-compatible", "my-r1") == 6144 and s.output_budget("openai", "gpt-4o") == 4096
    monkeypatch.setenv("METAL_ACCEL_THINKING", "sometimes")
    with pytest.raises(ValueError, match="thinking must be one of"):
        SynthSettings.from_env()


def test_thinking_request_reaches_the_server(llm):
    server = llm({"claude-test": [candidate("GOOD")]})
    run_loop(["anthropic:claude-test"], FAST.with_(thinking="enabled", reasoning_tokens=2048))
    body = server.requests[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048} and body["max_tokens"] == 8192 + 2048
