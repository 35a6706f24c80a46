"""Domain secrets: the request the SDK sends and what the daemon returns.

The test daemon runs with networking off (it leaves the host's bridges and
firewall alone), so a valid domain secret is refused with a clear
precondition error; against a daemon with networking (``$SBX_ADDR``) the
sandbox is created and must show the placeholder only. The egress proxy
itself is tested end to end in Go (internal/network, integration/).
"""

from __future__ import annotations

import pytest

import sbx

VALUE = "sk-pytest-domain-secret-value"


def test_domain_secret_json() -> None:
    d = sbx.DomainSecret("API_KEY", VALUE, ["api.example.com", "*.example.org"])
    assert d.to_json() == {"name": "API_KEY", "value": VALUE, "domains": ["api.example.com", "*.example.org"]}
    assert VALUE not in repr(d)
    with pytest.raises(TypeError):
        sbx.DomainSecret("K", "v", "a.test").to_json()  # type: ignore[arg-type]
    info = sbx.SandboxInfo.from_json({"id": "sb-x", "domainSecrets": [{"name": "API_KEY", "domains": ["a.test"]}]})
    assert info.domain_secrets == [sbx.DomainSecret("API_KEY", "", ["a.test"])]


def test_domain_secret_headers_and_query_json() -> None:
    d = sbx.DomainSecret("API_KEY", VALUE, ["api.example.com"], headers=["X-Api-Key"], allow_query=True)
    assert d.to_json() == {
        "name": "API_KEY",
        "value": VALUE,
        "domains": ["api.example.com"],
        "headers": ["X-Api-Key"],
        "allowQuery": True,
    }
    with pytest.raises(TypeError):
        sbx.DomainSecret("K", "v", ["a.test"], headers="X-Api-Key").to_json()  # type: ignore[arg-type]
    obj = {"name": "API_KEY", "domains": ["a.test"], "headers": ["X-Api-Key"], "allowQuery": True}
    info = sbx.SandboxInfo.from_json({"id": "sb-x", "domainSecrets": [obj]})
    assert info.domain_secrets == [sbx.DomainSecret("API_KEY", "", ["a.test"], ["X-Api-Key"], True)]


@pytest.mark.parametrize(
    "secret, message",
    [
        (sbx.DomainSecret("", VALUE, ["a.test"]), "no name"),
        (sbx.DomainSecret("BAD-NAME", VALUE, ["a.test"]), "BAD-NAME"),
        (sbx.DomainSecret("API_KEY", VALUE, []), "no domains"),
        (sbx.DomainSecret("API_KEY", VALUE, ["*.com"]), "*.com"),
        (sbx.DomainSecret("API_KEY", VALUE, ["a.test"], headers=["Bad Header"]), "Bad Header"),
        (sbx.DomainSecret("API_KEY", VALUE, ["a.test"], headers=["Connection"]), "Connection"),
    ],
)
def test_bad_domain_secrets_are_rejected(make_sandbox, secret: sbx.DomainSecret, message: str) -> None:
    with pytest.raises(sbx.InvalidArgumentError) as exc:
        make_sandbox(domain_secrets=[secret])
    assert message in str(exc.value)
    assert VALUE not in str(exc.value)


def test_domain_secret_placeholder_only(make_sandbox) -> None:
    secret = sbx.DomainSecret("API_KEY", VALUE, ["api.example.com"])
    try:
        sb = make_sandbox(domain_secrets=[secret])
    except sbx.FailedPreconditionError as e:
        assert "networking is off" in str(e)
        assert VALUE not in str(e)
        return
    info = sb.refresh().info
    assert info.domain_secrets == [sbx.DomainSecret("API_KEY", "", ["api.example.com"])]
    assert VALUE not in str(info.raw)
    placeholder = sb.run('printf %s "$API_KEY"').stdout
    assert placeholder.startswith("sbx-secret-api_key-")
    assert VALUE not in sb.run("env").stdout
