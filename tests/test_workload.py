"""optimize(workload=...): the calls a running application makes (decode steps) are captured and timed."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from metal_accel.core.specs import call_signature
from metal_accel.model_choice import DROPPED, prove_end_to_end
from metal_accel.report import ModuleReport, OptimizeReport
from metal_accel.runtime.capture import capture
from metal_accel.runtime.dispatch import dispatcher_of, install


class Mix(nn.Module):
    """Attends to a past that grows every step: its signature never repeats."""

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return x + past.mean(1, keepdim=True)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix, self.mlp = Mix(), nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
        past = x if past is None else torch.cat([past, x], 1)
        return self.mlp(self.mix(x, past)), past


def decode(model: nn.Module, steps: int = 5) -> torch.Tensor:
    x = torch.ones(1, 4, 8)
    y, past = model(x)
    for _ in range(steps):
        y, past = model(y[:, -1:], past)
    return y


def test_a_workload_adds_the_calls_that_repeat_in_it_and_not_those_that_grow():
    model = Decoder().eval()
    calls = capture(model, (torch.randn(2, 6, 8),), workload=decode)
    example = [c for c in calls if not c.from_workload]
    steps = [c for c in calls if c.from_workload]
    assert {c.spec.args[0].shape for c in example if c.name == "mlp"} == {(2, 6, 8)}
    step_mlp = [c for c in steps if c.name == "mlp"]
    assert len(step_mlp) == 1 and step_mlp[0].spec.args[0].shape == (1, 1, 8) and step_mlp[0].calls == 5
    assert not [c for c in steps if c.name == "mix"]  # a growing past: a new signature every step
    assert not [c for c in steps if c.spec.args[0].shape == (1, 4, 8)]  # the prompt: once per run


def slow(t: torch.Tensor, module: nn.Module) -> torch.Tensor:
    y = t
    for _ in range(3000):
        y = y + 0.0
    return module(y)


class Op:
    def __init__(self, fn) -> None:
        self.name, self.fn = "op", fn

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        return self.fn(args[0])


def test_the_end_to_end_stage_times_the_workload_and_drops_a_choice_that_slows_it():
    model = Decoder().eval()
    step = torch.randn(1, 1, 8)
    calls = []
    install(model.mlp, call_signature((step,), {}), Op(lambda t: slow(t, nn.Sequential(*model.mlp))))
    report = OptimizeReport("cpu", "test")
    report.modules = [ModuleReport("mlp", "torch.nn.Sequential", "float32[1,1,8]", "kernel", "proven alone")]

    def workload(m: nn.Module) -> torch.Tensor:
        calls.append(1)
        return decode(m)
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              workload=workload)
    assert calls and result is not None and result.workload is not None, result
    assert result.workload["speedup"] < 1.0 and result.dropped == ["Sequential: kernel"], result
    assert dispatcher_of(model.mlp) is None and report.modules[0].reason == DROPPED


def test_a_choice_the_example_call_never_reaches_is_not_judged_by_it(monkeypatch):
    """The example stage reads 0.8x (scripted: other work on the machine), but the decode-step choice never ran in
    it: the choice stays installed for the workload stage to judge."""
    import metal_accel.model_choice as mc

    def scripted(contenders, sync, budget_s, min_rounds=mc.MIN_ROUNDS):
        with torch.inference_mode():
            for fn in contenders.values():
                fn()
        return {name: [1.25 if name == "optimized" else 1.0] * 8 for name in contenders}, 1
    monkeypatch.setattr(mc, "time_contenders", scripted)
    model = Decoder().eval()
    install(model.mlp, call_signature((torch.randn(1, 1, 8),), {}), Op(lambda t: nn.Sequential(*model.mlp)(t)))
    report = OptimizeReport("cpu", "test")
    report.modules = [ModuleReport("mlp", "torch.nn.Sequential", "float32[1,1,8]", "kernel", "proven alone")]
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5)
    assert result is not None and not result.dropped and result.outcome != "eager", result
    assert dispatcher_of(model.mlp) is not None and report.modules[0].reason != DROPPED
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              workload=decode)  # reached by the decode steps, 0.8x there: dropped
    assert result is not None and result.dropped == ["Sequential: kernel"], result
    assert dispatcher_of(model.mlp) is None


def test_a_module_chosen_for_two_signatures_is_one_member_of_its_group():
    model = Decoder().eval()
    for shape in ((1, 1, 8), (2, 6, 8)):
        install(model.mlp, call_signature((torch.randn(shape),), {}), Op(lambda t: slow(t, nn.Sequential(*model.mlp))))
    report = OptimizeReport("cpu", "test")
    report.modules = [ModuleReport("mlp", "torch.nn.Sequential", spec, "kernel", "proven alone")
                      for spec in ("float32[2,6,8]", "float32[1,1,8]")]
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              workload=decode)
    assert result is not None and result.dropped == ["Sequential: kernel"], result
    assert dispatcher_of(model.mlp) is None and all(r.reason == DROPPED for r in report.modules)


class SlowMLP(nn.Sequential):
    """An MLP whose eager forward wastes time: a replacement that skips the waste makes decode faster."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return slow(x, nn.Sequential(*self))


def test_a_choice_that_speeds_the_workload_up_is_kept():
    """The workload's eager contender runs the workload too (not the example call): a decode-step choice that
    makes decode faster survives the stage."""
    model = Decoder()
    model.mlp = SlowMLP(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    model.eval()
    install(model.mlp, call_signature((torch.randn(1, 1, 8),), {}), Op(lambda t: nn.Sequential(*model.mlp)(t)))
    report = OptimizeReport("cpu", "test")
    report.modules = [ModuleReport("mlp", "test_workload.SlowMLP", "float32[1,1,8]", "kernel", "proven alone")]
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              workload=decode)
    assert result is not None and result.workload is not None, result
    assert result.workload["speedup"] > 1.5 and not result.dropped, result
    assert dispatcher_of(model.mlp) is not None


def _slow_decoder() -> tuple[Decoder, Decoder]:
    """A decoder whose MLP wastes time in eager, and a twin with the same weights that does not."""
    model = Decoder()
    model.mlp = SlowMLP(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    twin = Decoder()
    twin.mlp = nn.Sequential(*model.mlp)
    twin.mix = model.mix
    return model.eval(), twin.eval()


class Whole:
    """Stands in for the model compiled whole: any call of the model, answered by FN."""

    name = "whole"

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, args: tuple, kwargs: dict, state: list):
        self.calls += 1
        return self.fn(*args, **kwargs)


def test_the_model_compiled_whole_takes_every_call_of_the_workload_when_it_wins():
    model, twin = _slow_decoder()
    whole = Whole(twin)
    with torch.inference_mode():
        want = decode(twin)
    report = OptimizeReport("cpu", "test")
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              whole=whole, workload=decode)
    assert result is not None and result.workload["outcome"] == "everywhere", result
    assert dispatcher_of(model).fallback is whole
    whole.calls = 0
    with torch.inference_mode():
        got = decode(model)  # every call, decode steps' growing shapes included, is the whole model's
    assert whole.calls == 6
    torch.testing.assert_close(got, want)


def test_a_whole_model_that_is_wrong_on_the_workload_is_not_used_there():
    model, twin = _slow_decoder()
    wrong = Whole(lambda x, past=None: (twin(x, past)[0] + (x.shape[1] == 1), twin(x, past)[1]))  # decode steps off
    report = OptimizeReport("cpu", "test")
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              whole=wrong, workload=decode)
    assert result is not None and "incorrect on the workload" in result.workload["decision"], result
    disp = dispatcher_of(model)
    assert disp is None or disp.fallback is None


def test_under_a_whole_model_fallback_a_signature_keeps_its_own_op():
    """The example's signature keeps its own (static) whole-model op; every other call goes to the fallback,
    whose compiled code decode steps made shape-generic."""
    from metal_accel.whole_model import set_everywhere
    model, twin = _slow_decoder()
    own, every = Whole(twin), Whole(twin)
    x = torch.randn(2, 6, 8)
    install(model, call_signature((x,), {}), own)
    set_everywhere(model, every)
    with torch.inference_mode():
        model(x)
        decode(model)
    assert own.calls == 1 and every.calls == 6


class Picker(nn.Module):
    """A greedy 'LM': logits over 4 tokens whose two best are nearly tied at every step."""

    def forward(self, token: torch.Tensor, past: torch.Tensor | None = None):
        past = token if past is None else torch.cat([past, token], 1)
        logits = torch.tensor([1.0, 1.0 + 1e-7 * float(past.shape[1] % 2), 0.0, -1.0]).repeat(1, token.shape[1], 1)
        return logits, past


def greedy(model: nn.Module, steps: int = 4) -> torch.Tensor:
    tokens = torch.zeros(1, 2, dtype=torch.long)
    logits, past = model(tokens)
    for _ in range(steps):
        nxt = logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, nxt], 1)
        logits, past = model(nxt, past)
    return tokens


class OtherRounding(Picker):
    """Picker's logits one float32 ulp off at the nearly tied token (as another correct rounding would be)."""

    def forward(self, token: torch.Tensor, past: torch.Tensor | None = None):
        logits, past = super().forward(token, past)
        logits = logits.clone()
        logits[..., 1] = 1.0
        return logits, past


def test_a_near_tie_broken_the_other_way_is_judged_step_by_step_on_eagers_path():
    """Greedy decoding flips a nearly tied token under any other correct rounding: the check hands eager's
    logits on and compares each call within the rule, so the rounding passes and the tokens stay eager's."""
    from metal_accel.whole_model import check_on_workload
    model = Picker().eval()
    with torch.inference_mode():
        want = greedy(model)
        assert not torch.equal(greedy(OtherRounding()), want)  # its own tokens differ from eager's
    op = Whole(OtherRounding())
    assert check_on_workload(model, op, greedy) == ""
    assert op.calls == 5  # every call of the workload went through it
    with torch.inference_mode():
        assert torch.equal(greedy(model), want)  # the check left the model as it was


def test_the_workload_check_names_the_call_that_is_wrong():
    from metal_accel.whole_model import check_on_workload
    model = Picker().eval()
    count = {"n": 0}

    def third_call_wrong(t, past=None):
        count["n"] += 1
        logits, past = Picker()(t, past)
        return (logits + 0.5 if count["n"] == 3 else logits), past
    why = check_on_workload(model, Whole(third_call_wrong), greedy)
    assert why.startswith("incorrect on the workload's call 3 of 5"), why


def test_an_installed_dispatcher_shows_the_forwards_own_signature():
    """Callers inspect `forward` to decide what to pass (HF generate() passes logits_to_keep and position_ids
    only to a forward that names them): the dispatcher must not hide the module's parameters."""
    import inspect
    model = Decoder().eval()
    before = inspect.signature(model.forward)
    install(model, call_signature((torch.randn(1, 4, 8),), {}), Whole(model.forward))
    assert dispatcher_of(model) is not None
    assert inspect.signature(model.forward) == before
    assert list(inspect.signature(model.forward).parameters) == ["x", "past"]


@pytest.mark.slow
def test_a_bf16_llama_compiled_whole_is_judged_on_generate_against_float64():
    """bf16 rounding of the model compiled whole differs from eager's beyond bf16's plain tolerance on some
    logits; each generate() call is then judged against the model run in float64 on eager's path, as the
    proof judges a kernel, and the model's own bf16 parameters are back afterwards."""
    transformers = pytest.importorskip("transformers")
    from metal_accel.whole_model import check_on_workload, whole_model_op
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000)
    model = transformers.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)
    prompt = torch.randint(0, 1000, (1, 16))

    def generate(m: nn.Module) -> torch.Tensor:
        return m.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert check_on_workload(model, whole_model_op(model), generate) == ""
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
