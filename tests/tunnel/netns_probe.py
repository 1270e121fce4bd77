"""Run inside a network namespace: try one chat call per URL and print what happened as JSON.

Usage: python -m tests.tunnel.netns_probe <bearer> <url>...  (each URL is an OpenAI-style base)
"""

from __future__ import annotations

import json
import sys

import httpx


def main(bearer: str, urls: list[str]) -> None:
    results = []
    body = {"model": "m", "messages": [{"role": "user", "content": "from the sandbox"}]}
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        for url in urls:
            try:
                response = client.post(
                    url + "/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {bearer}"},
                )
            except httpx.HTTPError as exc:
                results.append({"url": url, "error": f"{type(exc).__name__}: {exc}"})
                continue
            results.append({"url": url, "status": response.status_code, "body": response.text})
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
