"""``rollbridge bridge serve``: the bridge as a standalone daemon for rollout developers and IDEs."""

from __future__ import annotations

import secrets
import signal
import sys

import click

from bridge.upstreams.routing import OFFLINE_MODEL

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
def serve(model: str, host: str, port: int, token: str | None) -> None:
    """Serve an OpenAI-compatible endpoint for MODEL until Ctrl-C.

    Rollouts call <url>/v1/rollouts/<id>/chat/completions; IDE tools can call
    <url>/v1/chat/completions and name their usage bucket with the X-Rollbridge-Rollout-Id
    header. A token you pass is never printed; a generated one is printed once, because you
    need it to call the bridge.
    """
    import trio

    from bridge.errors import BridgeBindError
    from bridge.server import BridgeConfig, BridgeHandle, run_bridge

    generated = token is None
    if token is not None and not token.strip():
        raise click.UsageError("--token must not be empty")
    token = token or secrets.token_hex(16)

    def log(level: str, message: str) -> None:
        if level in ("warning", "error"):
            click.echo(f"{level.upper()}: {message}", err=True)

    config = BridgeConfig(
        model=model, token=token, host=host, port=port, log=log, plain_chat_route=True
    )

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                handle: BridgeHandle = await nursery.start(run_bridge, config)
                click.echo(f"Bridge for {model} listening on {handle.base_url}")
                click.echo(
                    f"  rollouts: {handle.base_url}/v1/rollouts/<rollout-id>/chat/completions"
                )
                click.echo(f"  plain:    {handle.base_url}/v1/chat/completions")
                if generated:
                    click.echo(
                        f"  token:    {token}  (generated; pass --token or ${TOKEN_ENV} to choose)"
                    )
                click.echo("Press Ctrl-C to stop.")
                sys.stdout.flush()
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
        click.echo("Bridge stopped.")
        for rollout_id, usage in sorted(handle.ledger.snapshot().items()):
            click.echo(
                f"  usage {rollout_id}: {usage.calls} calls, {usage.total_tokens} tokens "
                f"({usage.prompt_tokens} prompt, {usage.completion_tokens} completion, "
                f"largest context {usage.max_context_tokens})"
            )

    try:
        trio.run(main)
    except* BridgeBindError as group:
        raise click.ClickException(str(group.exceptions[0])) from None
