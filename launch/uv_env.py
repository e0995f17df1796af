"""pip's install settings as uv's environment, for launch/setup.sh (standard library only; runs before setup).

    pip config list | python launch/uv_env.py

Reads `pip config list` (pip.conf files and PIP_* variables, `section.key='value'` lines) on stdin and
prints `NAME=value` lines for `env`, so that uv installs from the indexes, links, constraints and
certificate that pip would use. A variable wins over `install.` and `install.` over `global.`, as in pip.
Exits 1, saying which setting on stderr, when one has no uv equivalent here: setup then installs with pip.
"""

from __future__ import annotations

import ast
import sys

# pip key -> (uv variable, separator of its list); pip separates list values by whitespace.
TRANSLATED = {
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "cert": ("SSL_CERT_FILE", " "),
    "timeout": ("UV_HTTP_TIMEOUT", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", " "),
}
NO_EFFECT = {"disable-pip-version-check", "quiet", "verbose", "progress-bar", "root-user-action", "no-input"}
SECTIONS = (":env:", "install", "global")  # the first that sets a key wins


def uv_environment(pip_config: str) -> dict[str, str]:
    """{uv variable: value} for `pip config list` output. Raises ValueError naming a setting uv cannot take."""
    settings: dict[tuple[str, str], str] = {}
    for line in pip_config.splitlines():
        name, sep, quoted = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue  # another command's section (download., wheel., ...) or not a setting
        value = ast.literal_eval(quoted)  # pip prints repr(value)
        settings[section, key] = str(value)
    env: dict[str, str] = {}
    for key in sorted({key for _, key in settings}):
        value = next(settings[s, key] for s in SECTIONS if (s, key) in settings)
        if key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                env["UV_NO_INDEX"] = "1"
        elif key == "proxy":
            env["HTTP_PROXY"] = env["HTTPS_PROXY"] = value
        elif key in TRANSLATED:
            variable, separator = TRANSLATED[key]
            env[variable] = separator.join(value.split())
        elif key not in NO_EFFECT:
            raise ValueError(f"pip setting {key}={value!r} has no uv equivalent here")
    return env


def main() -> int:
    try:
        env = uv_environment(sys.stdin.read())
    except (ValueError, SyntaxError) as e:
        print(f"setup: {e}; installing with pip", file=sys.stderr)
        return 1
    print("\n".join(f"{name}={value}" for name, value in env.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
