"""The frozen blocked-name set covers what the installed LiteLLM would block (docs/spec/bridge.md §5.4)."""

from __future__ import annotations

from bridge._blocked import BLOCKED_NAMES
from bridge.policy import is_blocked


def test_frozen_set_covers_installed_litellm() -> None:
    import litellm
    from litellm.types.router import GenericLiteLLMParams
    from litellm.types.utils import all_litellm_params

    derived = (
        set(all_litellm_params)
        | set(GenericLiteLLMParams.model_fields)
        | set(litellm.common_cloud_provider_auth_params["params"])
    ) - {"metadata"}
    assert len(derived) > 250
    missing = sorted(name for name in derived if not is_blocked(name))
    assert missing == []


def test_metadata_is_never_blocked() -> None:
    assert "metadata" not in BLOCKED_NAMES
    assert not is_blocked("metadata")


def test_appendix_a_size() -> None:
    # 428 Appendix A names plus the static names no prefix covers.
    assert len(BLOCKED_NAMES) >= 428
