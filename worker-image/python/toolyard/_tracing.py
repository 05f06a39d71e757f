"""The function's own span, in the call's trace, when OpenTelemetry is installed.

The `toolyard` package needs nothing for this: when `opentelemetry-api` can be imported, each
call runs in a span named after the function whose parent is the call's `traceparent` (set by
`toolyard-runner`). When the process has no tracer provider of its own, `opentelemetry-sdk`
and `opentelemetry-exporter-otlp-proto-http` can be imported, and the standard variables name
a collector (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), one is set
up with `service.name` from `OTEL_SERVICE_NAME` (default `toolyard-function`).
`pip install 'toolyard[tracing]'` installs both. Without a collector named, nothing is imported
unless the function's own code has imported OpenTelemetry (and set up its own provider).

A one-call process waits at most `FLUSH_LIMIT_MS` for its span to be sent; a collector that
is down costs the span, never the call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

FLUSH_LIMIT_MS = 1000
DEFAULT_SERVICE = "toolyard-function"

_state: dict[str, Any] | None = None


def _setup() -> dict[str, Any]:
    """Import OpenTelemetry once; set up an exporting provider when asked to and none is set.
    Nothing is imported unless a collector is named or the function's code uses OpenTelemetry
    itself: a fresh process per call pays for every import."""
    if not _export_wanted() and "opentelemetry.trace" not in sys.modules:
        return {}
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return {}
    state: dict[str, Any] = {"trace": trace, "propagator": TraceContextTextMapPropagator(), "provider": None}
    if _export_wanted() and type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            pass
        else:
            service = os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
            # No flush at interpreter exit (it could wait the exporter's whole timeout): a
            # one-call process calls `flush`, bounded; the batch thread is a daemon.
            provider = TracerProvider(resource=Resource.create({"service.name": service}), shutdown_on_exit=False)
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            trace.set_tracer_provider(provider)
            state["provider"] = provider
    state["tracer"] = trace.get_tracer("toolyard")
    return state


def _export_wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


@contextlib.contextmanager
def function_span(name: str, traceparent: str | None) -> Iterator[None]:
    """Run the body in a span named `name`, child of `traceparent` (a new trace without one)."""
    global _state
    if _state is None:
        _state = _setup()
    if not _state:
        yield
        return
    context = _state["propagator"].extract({"traceparent": traceparent}) if traceparent else None
    with _state["tracer"].start_as_current_span(name, context=context, attributes={"code.function.name": name}):
        yield


def flush() -> None:
    """Send the spans still queued (a one-call process, before it exits), waiting at most
    `FLUSH_LIMIT_MS`. The SDK's own flush runs the export in the calling thread, with the
    exporter's retries and timeout (10 s by default): it runs in a daemon thread instead, which
    the interpreter does not wait for at exit."""
    provider = _state.get("provider") if _state else None
    if provider is None:
        return
    import threading

    sender = threading.Thread(target=provider.force_flush, name="toolyard-span-flush", daemon=True)
    sender.start()
    sender.join(FLUSH_LIMIT_MS / 1000)
