"""``rollbridge bridge serve``: the bridge as a standalone daemon for rollout developers and IDEs."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bridge.upstreams.routing import OFFLINE_MODEL

if TYPE_CHECKING:
    from bridge.server import BridgeHandle

TOKEN_ENV = "ROLLBRIDGE_BRIDGE_TOKEN"


@click.group(name="bridge")
def bridge() -> None:
    """Run the model bridge on its own."""


@bridge.command()
@click.option(
    "--model",
    required=True,
    help=f"Model to serve, as LiteLLM names it (openai/gpt-4o-mini, anthropic/…) or {OFFLINE_MODEL}.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=0, type=click.IntRange(0, 65535), help="Port (default: any free port)."
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    help=f"Bearer token clients must send (or ${TOKEN_ENV}); generated and printed when not given.",
)
@click.option(
    "--json",
    "json_output",
    is_flag=True,
    help="Print one JSON ready line (url, port, model, generated token) instead of the text.",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the bound port to this file once listening (removed at exit).",
)
@click.option("--no-preflight", is_flag=True, help="Skip the model probe at start (offline work).")
@click.option(
    "--hosted-tool",
    "hosted_tools",
    multiple=True,
    help="Grant a provider-run tool type on /responses and /v1/messages (web_search…); repeatable.",
)
@click.option(
    "--responses",
    type=click.Choice(["auto", "native", "translate"]),
    default="auto",
    show_default=True,
    help="How Responses calls reach an openai/… model (native: its /responses endpoint).",
)
@click.option(
    "--messages",
    type=click.Choice(["auto", "native", "translate"]),
    default="auto",
    show_default=True,
    help="How Messages calls reach an anthropic/… model (native: Anthropic's /v1/messages).",
)
@click.option(
    "--upstream-http2",
    is_flag=True,
    help="Call the provider over HTTP/2 (ALPN h2 for https, h2c for http): many calls per "
    "connection; a provider that speaks only HTTP/1.1 is called over HTTP/1.1 (with a warning).",
)
def serve(
    model: str,
    host: str,
    port: int,
    token: str | None,
    json_output: bool,
    port_file: str | None,
    no_preflight: bool,
    hosted_tools: tuple[str, ...],
    responses: str,
    messages: str,
    upstream_http2: bool,
) -> None:
    """Serve an OpenAI-compatible endpoint for MODEL until Ctrl-C.

    Rollouts call <url>/v1/rollouts/<id>/chat/completions (or /responses, or /v1/messages for
    Anthropic clients given <url>/v1/rollouts/<id> as their base URL); IDE tools can call
    <url>/v1/chat/completions, /v1/responses or /v1/messages and name their usage bucket with
    the X-Rollbridge-Rollout-Id header. A token you pass is never printed; a generated one is printed once, because you
    need it to call the bridge. The model is probed once before the bridge listens (as a run
    does), so a model that cannot answer fails here. GET /health, /v1/models and /v1/usage
    (live usage per id) are served too.
    """
    import trio

    from bridge.errors import BridgeBindError, PreflightError
    from bridge.server import BridgeConfig, run_bridge

    # `rollbridge --json bridge serve` asks for JSON as `bridge serve --json` does; with
    # `--plain` anywhere too it is the usage error every command makes of the pair.
    root = click.get_current_context().find_root().obj
    modes = root if isinstance(root, dict) else {}
    if (json_output or modes.get("json")) and modes.get("plain"):
        raise click.UsageError(
            "Conflicting output format selectors: json, plain. "
            "Choose at most one of --json or --plain."
        )
    json_output = json_output or bool(modes.get("json"))
    generated = token is None
    if token is not None and not token.strip():
        raise click.UsageError("--token must not be empty")
    token = token or secrets.token_hex(16)

    def log(level: str, message: str) -> None:
        if level in ("warning", "error"):
            click.echo(f"{level.upper()}: {message}", err=True)

    from bridge.apis import ApiOptions

    config = BridgeConfig(
        model=model,
        token=token,
        host=host,
        port=port,
        log=log,
        plain_chat_route=True,
        apis=ApiOptions(hosted_tools, responses, messages),
        upstream_http2=upstream_http2,
    )

    async def main() -> None:
        handle: BridgeHandle | None = None
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    # Also during the preflight, which may wait on a slow provider.
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                if not no_preflight:
                    await _preflight(model)
                handle = await nursery.start(run_bridge, config)
                if port_file is not None:
                    _write_port_file(Path(port_file), handle.port)
                if json_output:
                    _ready_line(handle, model, token if generated else None)
                else:
                    _ready_text(handle, model, token if generated else None)
                sys.stdout.flush()
        if json_output or handle is None:
            return
        click.echo("Bridge stopped.")
        for rollout_id, usage in sorted(handle.ledger.snapshot().items()):
            click.echo(
                f"  usage {rollout_id}: {usage.calls} calls, {usage.total_tokens} tokens "
                f"({usage.prompt_tokens} prompt, {usage.completion_tokens} completion, "
                f"largest context {usage.max_context_tokens})"
            )

    try:
        trio.run(main)
    except* (BridgeBindError, PreflightError) as group:
        raise click.ClickException(str(group.exceptions[0])) from None
    finally:
        if port_file is not None:
            Path(port_file).unlink(missing_ok=True)


async def _preflight(model: str) -> None:
    """The run's model probe: a fatal failure raises PreflightError, a warning goes to stderr."""
    from bridge.preflight import preflight

    warning = await preflight(model)
    if warning:
        click.echo(f"WARNING: {warning}", err=True)


def _write_port_file(path: Path, port: int) -> None:
    """The port and a newline, atomically (a reader never sees a partial file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="ascii")
    os.replace(tmp, path)


def _ready_line(handle: BridgeHandle, model: str, generated_token: str | None) -> None:
    doc = {
        "ready": True,
        "url": handle.base_url,
        "port": handle.port,
        "model": model,
        "pid": os.getpid(),
        # Only a generated token: the caller that chose one already has it.
        "token": generated_token,
    }
    click.echo(json.dumps(doc))


def _ready_text(handle: BridgeHandle, model: str, generated_token: str | None) -> None:
    click.echo(f"Bridge for {model} listening on {handle.base_url}")
    click.echo(f"  rollouts: {handle.base_url}/v1/rollouts/<rollout-id>/chat/completions")
    click.echo(f"  plain:    {handle.base_url}/v1/chat/completions")
    if generated_token:
        click.echo(
            f"  token:    {generated_token}  (generated; pass --token or ${TOKEN_ENV} to choose)"
        )
    click.echo("Press Ctrl-C to stop.")
