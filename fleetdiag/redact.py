"""``--redact``: make a report safe to paste into a ticket or a chat.

Replaces, in every string of a result (the decisive line, its traceback, the
log path, errors, notes, facts):

- **IP addresses** (IPv4, IPv6, and AWS-style ``ip-10-0-0-1`` names) → ``ip-N``;
  loopback and unspecified addresses (``127.0.0.1``, ``0.0.0.0``, ``::1``)
  identify nothing and stay;
- **host names**: the inventory's names, addresses and jump hosts, this
  machine's name, fully qualified names under common suffixes (``.internal``,
  ``.local``, ``.com`` …, except well-known public ones such as github.com or
  huggingface.co), NCCL's ``host:pid:tid`` prefixes and ``hostname=`` values
  → ``host-N``;
- **user names**: the inventory's users, the local user, ``/home/NAME``,
  ``/Users/NAME``, ``user@host`` and e-mail addresses → ``user-N``
  (system accounts such as ``root`` or ``ubuntu`` identify no one and stay);
- **secret-looking tokens**: Hugging Face (``hf_…``), OpenAI/Anthropic
  (``sk-…``), GitHub, Slack, AWS and Google keys, JWTs, ``Bearer``/
  ``Authorization`` values, ``password=``/``*_TOKEN=``/``*_API_KEY=`` values,
  ``--hf-token X``-style arguments, URL credentials and signed-URL query
  parameters, private-key blocks and long random-looking strings → ``<redacted>``.

The same value always gets the same placeholder within one ``Redactor``, so
"host-3 and host-7 fail the same way" still reads true; placeholders are
numbered in order of first appearance (the CLI seeds the inventory's hosts
first, in inventory order). Secrets get no number: nothing about them survives.
"""

from __future__ import annotations

import copy
import dataclasses
import getpass
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from .records import HostResult, host_result_from_json

REDACTED = "<redacted>"

# Accounts that name no person: never replaced (and "root" is a word in "root cause").
SYSTEM_USERS = frozenset(
    {
        "root",
        "admin",
        "administrator",
        "ubuntu",
        "debian",
        "centos",
        "ec2-user",
        "fedora",
        "user",
        "nobody",
        "daemon",
        "www-data",
        "ray",
        "jovyan",
        "app",
        "runner",
        "azureuser",
        "opc",
        "cloud-user",
        "core",
    }
)
# Public names that identify no one's infrastructure.
PUBLIC_DOMAINS = (
    "github.com",
    "githubusercontent.com",
    "huggingface.co",
    "hf.co",
    "pytorch.org",
    "python.org",
    "pypi.org",
    "nvidia.com",
    "vllm.ai",
    "ray.io",
    "readthedocs.io",
    "deepspeed.ai",
    "sglang.ai",
    "docker.io",
    "docker.com",
    "anaconda.org",
    "conda.io",
    "example.com",
    "example.org",
    "example.net",
    "googleapis.com",
    "microsoft.com",
    "amazon.com",
    "cuda.com",
    "kernel.org",
    "ubuntu.com",
    "debian.org",
)
_TLDS = (
    "com|net|org|io|ai|dev|cloud|app|co|internal|local|lan|corp|intra|intranet|cluster|svc|private|home|"
    "example|test|invalid|localdomain"
)
# Fields that are identifiers of fleetdiag's own vocabulary, never free text.
_KEEP_KEYS = frozenset(
    {
        "fingerprint",
        "verdict",
        "category",
        "rule",
        "exception_type",
        "error_kind",
        "state",
        "previous",
        "event",
        "status",
    }
)

_SECRET_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # private-key blocks (each line of a traceback list comes separately: catch the armour too)
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|$)", re.S), REDACTED),
    # credentials in URLs: scheme://user:password@host, scheme://:password@host (redis), a password with "@"
    (re.compile(r"(?P<k>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^\s/]+(?=@[^\s/@]+)"), r"\g<k>" + REDACTED),
    # curl -u user:password, --user user:password
    (
        re.compile(r"(?P<k>(?<![\w-])(?:-u|--user|--proxy-user)(?:\s+|=)[\"']?[^\s:\"']*:)[^\s\"']+"),
        r"\g<k>" + REDACTED,
    ),
    # DB_PASS=…, MYSQL_PWD=…, PGPASSWORD is caught below (a name whose last word is pass or pwd)
    (
        re.compile(
            r"(?P<k>[\"']?\b(?:[A-Za-z0-9]+[_.-])*(?:pass|pwd)[\"']?\s*[:=]\s*[\"']?)"
            r"(?!None\b|null\b|<redacted>)[^\s\"',;)}\]]+",
            re.I,
        ),
        r"\g<k>" + REDACTED,
    ),
    # signed-URL and API query parameters
    (
        re.compile(
            r"(?P<k>[?&](?:[A-Za-z0-9_-]*(?:token|key|secret|signature|sig|password|credential|auth)"
            r"[A-Za-z0-9_-]*)=)[^&\s\"'#]+",
            re.I,
        ),
        r"\g<k>" + REDACTED,
    ),
    # Authorization headers and bearer tokens
    (
        re.compile(
            r"(?P<k>\b(?:Authorization|Proxy-Authorization)\s*[:=]\s*(?:(?:Bearer|Basic|Token)\s+)?)[^\s\"',]+", re.I
        ),
        r"\g<k>" + REDACTED,
    ),
    (re.compile(r"(?P<k>\bBearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.I), r"\g<k>" + REDACTED),
    # well-known token formats
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bsk-(?:proj-|ant-(?:api\d+-)?|svcacct-)?[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), REDACTED),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # NAME=value / 'name': 'value' where the name says secret
    (
        re.compile(
            r"(?P<k>[\"']?\b[A-Za-z0-9_.-]*(?:token|secret|passwd|password|passphrase|api[_-]?key|apikey|"
            r"access[_-]?key|private[_-]?key|credentials?|auth[_-]?key)[\"']?\s*[:=]\s*[\"']?)"
            r"(?!None\b|null\b|True\b|False\b|true\b|false\b|\d+\b|<redacted>)[^\s\"',;)}\]]{3,}",
            re.I,
        ),
        r"\g<k>" + REDACTED,
    ),
    # --hf-token X, --api-key=X, --password X (the flag ends with the secret word)
    (
        re.compile(
            r"(?P<k>--(?:[A-Za-z0-9]+-)*(?:token|api-key|apikey|secret|password|passwd|passphrase|access-key|"
            r"secret-key|auth-token)(?:\s+|=))(?!-)[^\s\"',]+",
            re.I,
        ),
        r"\g<k>" + REDACTED,
    ),
]
# Long random-looking strings (base64/hex keys) with mixed case and digits.
_ENTROPY = re.compile(r"(?<![\w/+=.-])[A-Za-z0-9+/_-]{32,}={0,2}(?![\w/+=.-])")

_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w.]+)?(?![\w:])")
_AWS_HOST = re.compile(r"\bip-\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}(?:\.[A-Za-z0-9.-]+)?\b")
_EMAIL = re.compile(r"(?<![\w.+-])([A-Za-z0-9._%+-]{1,64})@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})\b")
_USER_AT = re.compile(r"(?<![\w.+/-])([a-z_][a-z0-9_.-]{0,31})@([A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9])(?![\w-])")
_HOME = re.compile(r"(?P<k>(?:/home/|/Users/|[A-Za-z]:\\Users\\))(?P<u>[^/\\\s:'\"]+)")
_FQDN = re.compile(r"(?<![\w.@/-])((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+(?:" + _TLDS + r"))(?![\w-])")
_NCCL_HOST = re.compile(r"(?<![\w.-])([A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*)(?=:\d+:\d+ \[\d+\])")
_URL_USER = re.compile(r"(?P<k>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<u>[^/\s:@]+)(?=(?::[^\s/]*)?@[^\s/@]+)")
_URL_HOST = re.compile(
    r"(?P<k>\b[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^/\s@]*@)?)(?P<h>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)(?=[:/?#\s\"')]|$)"
)
_HOST_KV = re.compile(
    r"(?P<k>\b(?:host|hostname|node|nodename|node_name|node_ip_address|master_addr|"
    r"MASTER_ADDR)\s*[=:]\s*[\"']?)(?P<v>[A-Za-z][A-Za-z0-9.-]*[A-Za-z0-9])",
    re.I,
)


class Redactor:
    """Consistent replacement of names, addresses and secrets (see the module doc)."""

    def __init__(self, hosts: Iterable[str] = (), users: Iterable[str] = (), local: bool = True):
        self.maps: dict[str, dict[str, str]] = {"host": {}, "ip": {}, "user": {}}
        self._host_words: re.Pattern[str] | None = None
        self._user_words: re.Pattern[str] | None = None
        if local:  # the local user shows up in paths and ssh targets of the report
            try:
                self.add_users([getpass.getuser()])
            except (KeyError, OSError):
                pass
        self.add_hosts(hosts)
        self.add_users(users)

    # ------------------------------------------------------------ seeding

    def add_hosts(self, names: Iterable[str | None]) -> None:
        for n in names:
            if not n:
                continue
            if _is_ip(n):
                self._placeholder("ip", n)
            elif len(n) >= 2 and n.lower() not in ("localhost",):
                self._placeholder("host", n)
        self._host_words = _words(self.maps["host"])

    def add_users(self, names: Iterable[str | None]) -> None:
        for n in names:
            if n and n.lower() not in SYSTEM_USERS and len(n) >= 2:
                self._placeholder("user", n)
        self._user_words = _words(self.maps["user"])

    def seed_inventory(self, inv: Any) -> None:
        """Number the inventory's hosts first, in inventory order, so placeholders are stable."""
        hosts = list(getattr(inv, "hosts", {}).values())
        self.add_hosts(n for h in hosts for n in (h.name, getattr(h, "address", None), getattr(h, "jump", None)))
        self.add_users(getattr(h, "user", None) for h in hosts)

    def _placeholder(self, kind: str, value: str) -> str:
        m = self.maps[kind]
        if value not in m:
            m[value] = f"{kind}-{len(m) + 1}"
            if kind == "host":
                self._host_words = None
            elif kind == "user":
                self._user_words = None
        return m[value]

    # ------------------------------------------------------------ text

    def text(self, s: str) -> str:
        """One string, redacted."""
        if not s:
            return s
        for pat, repl in _SECRET_PATTERNS:
            s = pat.sub(repl, s)
        s = _ENTROPY.sub(lambda m: REDACTED if _random_looking(m.group(0)) else m.group(0), s)
        s = _URL_USER.sub(
            lambda m: (
                m.group("k")
                + (m.group("u") if _is_placeholder(m.group("u")) else self._placeholder("user", m.group("u")))
            ),
            s,
        )
        s = _EMAIL.sub(lambda m: f"{self._user(m.group(1))}@{self._host(m.group(2))}", s)
        s = _HOME.sub(lambda m: m.group("k") + self._user(m.group("u")), s)
        s = _USER_AT.sub(self._user_at, s)
        s = _URL_HOST.sub(self._url_host, s)
        s = _AWS_HOST.sub(lambda m: self._placeholder("host", m.group(0)), s)
        s = _IPV4.sub(self._ipv4, s)
        s = _IPV6.sub(self._ipv6, s)
        s = _NCCL_HOST.sub(lambda m: self._host(m.group(1)), s)
        s = _HOST_KV.sub(
            lambda m: m.group("k") + (m.group("v") if _is_placeholder(m.group("v")) else self._host(m.group("v"))), s
        )
        s = _FQDN.sub(lambda m: m.group(0) if _public(m.group(1)) else self._host(m.group(1)), s)
        if self._host_words is None:
            self._host_words = _words(self.maps["host"])
        if self._host_words is not None:
            s = self._host_words.sub(lambda m: self.maps["host"][m.group(0)], s)
        if self._user_words is None:
            self._user_words = _words(self.maps["user"])
        if self._user_words is not None:
            s = self._user_words.sub(lambda m: self.maps["user"][m.group(0)], s)
        return s

    def _host(self, name: str) -> str:
        if _is_placeholder(name):
            return name
        return self._placeholder("ip", name) if _is_ip(name) else self._placeholder("host", name)

    def _user(self, name: str) -> str:
        if name.lower() in SYSTEM_USERS or _is_placeholder(name):
            return name
        return self._placeholder("user", name)

    def _url_host(self, m: re.Match[str]) -> str:
        h = m.group("h")
        if _is_placeholder(h) or _public(h) or h.lower() == "localhost" or "." not in h and not _is_ip(h):
            return m.group(0)  # a bare word (http://server/) is left to the inventory's names
        if _is_ip(h):
            return m.group(0)  # the address patterns below handle it (and keep loopback)
        return m.group("k") + self._host(h)

    def _user_at(self, m: re.Match[str]) -> str:
        user, host = m.group(1), m.group(2)
        if not re.search(r"[A-Za-z]", host) and not _is_ip(host):
            return m.group(0)
        return f"{self._user(user)}@{self._host(host)}"

    def _ipv4(self, m: re.Match[str]) -> str:
        v = m.group(0)
        try:
            ip = ipaddress.IPv4Address(v)
        except ValueError:
            return v
        if ip.is_loopback or ip.is_unspecified or v == "255.255.255.255":
            return v
        return self._placeholder("ip", v)

    def _ipv6(self, m: re.Match[str]) -> str:
        v = m.group(0)
        bare = v.split("%", 1)[0]
        if "::" not in bare and bare.count(":") < 7:
            return v
        try:
            ip = ipaddress.IPv6Address(bare)
        except ValueError:
            return v
        if ip.is_loopback or ip.is_unspecified:
            return v
        return self._placeholder("ip", v)

    # ------------------------------------------------------------ records

    def result(self, res: HostResult) -> HostResult:
        """A redacted copy of one host result (the original is untouched)."""
        self.add_hosts([res.host, res.address])
        return host_result_from_json(self.obj(res.to_json()))

    def obj(self, o: Any, key: str | None = None) -> Any:
        """A redacted copy of any JSON-like value or dataclass (strings anywhere inside)."""
        if isinstance(o, str):
            return o if key in _KEEP_KEYS else self.text(o)
        if isinstance(o, dict):
            return {
                (self.text(k) if isinstance(k, str) and k not in _KEEP_KEYS else k): self.obj(
                    v, k if isinstance(k, str) else None
                )
                for k, v in o.items()
            }
        if isinstance(o, (list, tuple)):
            items = [self.obj(v, key) for v in o]
            return type(o)(items) if isinstance(o, tuple) and not hasattr(o, "_fields") else items
        if isinstance(o, PurePath):
            return type(o)(self.text(str(o)))
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            new = copy.copy(o)
            for f in dataclasses.fields(o):
                try:
                    object.__setattr__(new, f.name, self.obj(getattr(o, f.name), f.name))
                except (AttributeError, TypeError):
                    pass
            return new
        return o


def _words(mapping: dict[str, str]) -> re.Pattern[str] | None:
    names = sorted((n for n in mapping if not _is_placeholder(n)), key=len, reverse=True)
    if not names:
        return None
    return re.compile(r"(?<![A-Za-z0-9_-])(?:" + "|".join(re.escape(n) for n in names) + r")(?![A-Za-z0-9_-])")


def _is_placeholder(s: str) -> bool:
    return bool(re.fullmatch(r"(?:host|ip|user)-\d+", s))


def _is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s.split("%", 1)[0])
        return True
    except ValueError:
        return False


def _public(name: str) -> bool:
    n = name.lower()
    return any(n == d or n.endswith("." + d) for d in PUBLIC_DOMAINS)


def _random_looking(s: str) -> bool:
    """A key, not a word or a path: mixed case and digits, few separators."""
    if s.count("/") > 2 or s.count("_") > 3 or s.count("-") > 3:
        return False
    return bool(re.search(r"[a-z]", s) and re.search(r"[A-Z]", s) and re.search(r"[0-9]", s))


_default: Redactor | None = None


def _get(redactor: Redactor | None) -> Redactor:
    global _default
    if redactor is not None:
        return redactor
    if _default is None:
        _default = Redactor()
    return _default


def redact_text(text: str, redactor: Redactor | None = None) -> str:
    """Redact one string (a process-wide Redactor keeps placeholders consistent)."""
    return _get(redactor).text(text)


def redact_result(res: HostResult, redactor: Redactor | None = None) -> HostResult:
    """A redacted copy of one host result."""
    return _get(redactor).result(res)


# --------------------------------------------------------------------------- command lines and environments
# (the facts a probe collects: a serving process's argv and environment, before they reach a report)

SECRET_NAME = re.compile(r"token|secret|passw|api[-_]?key|credential|auth|pwd|(?:^|[_.-])pass(?:$|[_.-])", re.I)
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_USER_FLAGS = ("-u", "--user", "--proxy-user")
MASK = "***"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with secret-looking values masked (``--api-key sk-…``, ``HF_TOKEN=…``,
    ``DB_PASS=…``, ``curl -u admin:pw``).

    Command lines end up in JSON reports and the history store; a vLLM
    ``--api-key`` must not.
    """
    out: list[str] = []
    hide_next = False
    user_next = False
    for tok in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if user_next:
            user, colon, _ = tok.partition(":")
            out.append(f"{user}:{MASK}" if colon else tok)
            user_next = False
            continue
        name, eq, value = tok.partition("=")
        if tok in _USER_FLAGS:
            out.append(tok)
            user_next = True
            continue
        if eq and name in _USER_FLAGS and ":" in value:
            out.append(f"{name}={value.partition(':')[0]}:{MASK}")
            continue
        if tok.startswith("-") and SECRET_NAME.search(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(tok)
                hide_next = True
            continue
        if eq and _ENV_ASSIGN.match(tok) and SECRET_NAME.search(name):
            out.append(f"{name}={MASK}")
            continue
        out.append(_SECRET_PATTERNS[1][0].sub(r"\g<k>" + MASK, tok))  # URL credentials inside a value
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret-looking names masked."""
    return {k: (MASK if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_cmdline(cmdline: str) -> str:
    """``redact_argv`` for a space-joined command line."""
    return " ".join(redact_argv(cmdline.split(" ")))
