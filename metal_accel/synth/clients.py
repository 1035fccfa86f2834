"""Chat clients over the official SDKs (openai.AsyncOpenAI, anthropic.AsyncAnthropic).

Keys are never passed in or read here except the one variable of OpenAI-compatible servers
(METAL_ACCEL_COMPATIBLE_API_KEY): the SDKs resolve their own credentials (OPENAI_API_KEY,
ANTHROPIC_API_KEY, their config files). The SDKs retry 429 (honouring retry-after), 408/409,
5xx, connection errors and timeouts `sdk_max_retries` times; after they give up, `complete`
retries a retryable failure `extra_retries` more times with exponential backoff, logging each
retry. One request, all attempts together, ends by its deadline (`request_deadline_s`) or the
caller's budget, whichever is first. Every error message that leaves this module is scrubbed of
credentials.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import MetalAccelError
from ..core.scrub import register_secret, scrub_exception
from . import logfilter
from .answers import TRUNCATED_FINISH
from .models import COMPATIBLE_KEY_ENV, ModelSpec, ProviderConfigError
from .settings import SynthSettings

log = logging.getLogger(__name__)
Message = dict[str, str]  # {"role": "user" | "assistant", "content": text}
_MAX_BACKOFF_S = 60.0


@dataclass
class Completion:
    """One answer and what it cost."""

    text: str
    tokens_in: int
    tokens_out: int
    latency_s: float
    estimated_tokens: bool = False   # the server reported no usage; tokens estimated from text length
    retries: int = 0                 # our own retries (the SDK's are not visible)
    finish: str = ""                 # the finish reason the server gave ("stop", "length", "max_tokens", ...)
    reasoning_tokens: int = 0        # of tokens_out, those spent reasoning (where the server says)
    output_limit: int = 0            # the output-token limit the request was sent with

    @property
    def truncated(self) -> bool:
        """The answer stopped at the output limit."""
        return self.finish in TRUNCATED_FINISH


class RequestFailed(MetalAccelError):
    """A request failed for good. `fatal`: the model is unusable (credentials, unknown model).
    `billable`: it was abandoned after the server may have done the work (a timeout), so its
    reservation is charged. `out_of_budget`: the caller's time budget ended first (the module's, not the
    request's own deadline): the request was cut short, as a cancellation is, rather than failed."""

    def __init__(self, message: str, *, fatal: bool = False, billable: bool = False,
                 out_of_budget: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.billable = billable
        self.out_of_budget = out_of_budget


class ChatClient(Protocol):
    spec: ModelSpec

    async def complete(self, system: str, messages: list[Message], *, deadline: float | None = None) -> Completion: ...

    async def close(self) -> None: ...


def _sdk(kind: str) -> Any:
    name = "anthropic" if kind == "anthropic" else "openai"
    try:
        return __import__(name)
    except ImportError:
        raise ProviderConfigError(f"the {name} SDK is not installed: pip install 'metal-accel[{name}]'") from None


def _build(spec: ModelSpec, settings: SynthSettings) -> Any:
    """A fresh SDK client (no network). Raises ProviderConfigError when the SDK finds no credentials."""
    sdk = _sdk(spec.kind)
    common = {"timeout": settings.request_timeout_s, "max_retries": settings.sdk_max_retries}
    try:
        if spec.kind == "anthropic":
            client = sdk.AsyncAnthropic(**common)
        elif spec.kind == "openai":
            client = sdk.AsyncOpenAI(**common)
        else:
            client = sdk.AsyncOpenAI(api_key=os.environ.get(COMPATIBLE_KEY_ENV) or "not-needed",
                                     base_url=spec.base_url, **common)
    except Exception as exc:  # the SDKs raise their base error class for missing credentials
        hint = {"openai": "set OPENAI_API_KEY",
                "anthropic": "set ANTHROPIC_API_KEY or check the SDK's configuration"}.get(spec.kind,
                                                                                           "check the SDK's configuration")
        raise ProviderConfigError(f"{spec.label}: cannot create the client ({hint}): {scrub_exception(exc)}") from None
    for attr in ("api_key", "auth_token"):
        value = getattr(client, attr, None)
        register_secret(value if isinstance(value, str) else None)
    if spec.kind == "anthropic" and not any(getattr(client, a, None) for a in ("api_key", "auth_token", "credentials")):
        # the SDK builds a client without credentials and fails only when a request is sent
        raise ProviderConfigError(f"{spec.label}: no Anthropic credentials: set ANTHROPIC_API_KEY (or "
                                  "ANTHROPIC_AUTH_TOKEN, or an SDK profile)")
    logfilter.install()
    return client


def check_configured(spec: ModelSpec, settings: SynthSettings) -> None:
    """Raise ProviderConfigError if `spec` cannot be used here (SDK missing, credentials missing)."""
    _build(spec, settings)


def make_client(spec: ModelSpec, settings: SynthSettings) -> "SDKChatClient":
    """A client for `spec`; create it inside the event loop that will use it."""
    return SDKChatClient(spec, settings, _build(spec, settings))


class SDKChatClient:
    """One model behind one SDK client; `complete` sends a system prompt and a conversation."""

    def __init__(self, spec: ModelSpec, settings: SynthSettings, client: Any) -> None:
        self.spec = spec
        self.settings = settings
        self._client = client
        self._sdk = _sdk(spec.kind)

    async def close(self) -> None:
        try:
            await self._client.close()
        except Exception:  # closing is best effort
            pass

    async def complete(self, system: str, messages: list[Message], *, deadline: float | None = None) -> Completion:
        """Send one request; retry retryable failures with backoff. Everything (the SDK's attempts and
        ours) ends by `deadline` (monotonic; the caller's budget) and by the request's own deadline
        (`request_deadline_s` after the start), whichever comes first."""
        start = time.monotonic()
        own = start + self.settings.request_deadline_s
        end = own if deadline is None else min(deadline, own)
        retries = 0
        while True:
            t0 = time.monotonic()
            left = end - t0
            if left <= 0:
                raise self._out_of_time(own, end, billable=retries > 0)
            try:
                comp = await asyncio.wait_for(self._request(system, messages, min(self.settings.request_timeout_s,
                                                                                    left)), left)
            except asyncio.TimeoutError:
                raise self._out_of_time(own, end, billable=True) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                kind = self._classify(exc)
                what = scrub_exception(exc)
                billable = self._is_timeout(exc)  # the server may have done (and billed) the work
                if kind == "fatal":
                    raise RequestFailed(what, fatal=True) from None
                if kind == "fail" or retries >= self.settings.extra_retries:
                    raise RequestFailed(what + (f" (after {retries} extra retries)" if retries else ""),
                                        billable=billable) from None
                delay = self._backoff(exc, retries)
                if time.monotonic() + delay >= end:
                    raise RequestFailed(f"{what} (no time left to retry)", billable=billable) from None
                retries += 1
                log.info("metal_accel: %s: %s; retry %d of %d in %.1f s", self.spec.label, what, retries,
                         self.settings.extra_retries, delay)
                await asyncio.sleep(delay)
                continue
            comp.latency_s, comp.retries = time.monotonic() - t0, retries
            return comp

    def _out_of_time(self, own: float, end: float, *, billable: bool) -> RequestFailed:
        if end < own:
            return RequestFailed("out of time budget while waiting for an answer", billable=billable, out_of_budget=True)
        return RequestFailed(f"no answer within the request deadline ({self.settings.request_deadline_s:g} s, all "
                             "attempts together)", billable=billable)

    def _is_timeout(self, exc: Exception) -> bool:
        return isinstance(exc, getattr(self._sdk, "APITimeoutError", ())) or isinstance(exc, TimeoutError)

    def request_args(self, system: str, messages: list[Message]) -> dict[str, Any]:
        """The keyword arguments of the SDK call (no credentials: those live in the SDK client)."""
        s, spec = self.settings, self.spec
        reasons = s.reasons(spec.kind, spec.model)
        limit = s.output_budget(spec.kind, spec.model)
        extra: dict[str, Any] = {}
        if s.temperature is not None and not reasons:  # reasoning models and thinking take only the default
            extra["temperature"] = s.temperature
        if spec.kind == "anthropic":
            if reasons and s.thinking == "enabled":
                extra["thinking"] = {"type": "enabled", "budget_tokens": s.reasoning_tokens}
            elif reasons and s.thinking == "adaptive":
                extra["thinking"] = {"type": "adaptive"}
            return {"model": spec.model, "max_tokens": limit, "system": system, "messages": messages, **extra}
        if reasons and s.reasoning_effort and spec.kind == "openai":
            extra["reasoning_effort"] = s.reasoning_effort
        key = "max_completion_tokens" if spec.kind == "openai" else "max_tokens"
        return {"model": spec.model, "messages": [{"role": "system", "content": system}, *messages], key: limit,
                **extra}

    async def _request(self, system: str, messages: list[Message], timeout: float) -> Completion:
        args = {**self.request_args(system, messages), "timeout": timeout}
        reasoning = 0
        if self.spec.kind == "anthropic":
            resp = await self._client.messages.create(**args)
            text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
            finish = getattr(resp, "stop_reason", None) or ""
            usage = getattr(resp, "usage", None)
            t_in = getattr(usage, "input_tokens", None)
            t_out = getattr(usage, "output_tokens", None)
        else:
            resp = await self._client.chat.completions.create(**args)
            choice = resp.choices[0] if resp.choices else None
            text = (choice.message.content or "") if choice is not None and choice.message is not None else ""
            finish = (getattr(choice, "finish_reason", None) or "") if choice is not None else ""
            usage = getattr(resp, "usage", None)
            t_in = getattr(usage, "prompt_tokens", None)
            t_out = getattr(usage, "completion_tokens", None)
            details = getattr(usage, "completion_tokens_details", None)
            reasoning = int(getattr(details, "reasoning_tokens", None) or 0)
        limit = int(args.get("max_tokens") or args.get("max_completion_tokens") or 0)
        if t_in is None or t_out is None:  # some compatible servers report no usage
            sent = len(system) + sum(len(m["content"]) for m in messages)
            return Completion(text, sent // 4, len(text) // 4, 0.0, True, finish=str(finish), output_limit=limit)
        return Completion(text, int(t_in), int(t_out), 0.0, False, finish=str(finish), reasoning_tokens=reasoning,
                          output_limit=limit)

    def _classify(self, exc: Exception) -> str:
        """'retry' (rate limit, timeout, connection, 5xx), 'fatal' (credentials, unknown model) or 'fail'."""
        sdk = self._sdk
        if isinstance(exc, TypeError) and "authentication" in str(exc).lower():
            return "fatal"  # anthropic: no credentials resolved
        for name in ("AuthenticationError", "PermissionDeniedError", "NotFoundError"):
            if isinstance(exc, getattr(sdk, name, ())):
                return "fatal"
        for name in ("RateLimitError", "APITimeoutError", "APIConnectionError", "InternalServerError"):
            if isinstance(exc, getattr(sdk, name, ())):
                return "retry"
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and (status >= 500 or status in (408, 409, 429)):
            return "retry"
        return "fail"

    def _backoff(self, exc: Exception, retries: int) -> float:
        delay = self.settings.retry_backoff_s * (2 ** retries)
        response = getattr(exc, "response", None)
        header = getattr(response, "headers", {}).get("retry-after") if response is not None else None
        try:
            delay = max(delay, float(header)) if header is not None else delay
        except ValueError:
            pass
        return min(_MAX_BACKOFF_S, delay) * (1 + 0.1 * random.random())
