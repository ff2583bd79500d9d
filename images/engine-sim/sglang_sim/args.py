"""SGLang 0.5.23's command line, rebuilt from its option table.

``prog`` is "sglang serve" and ``allow_abbrev`` is argparse's default (True), as in
``sglang.srt.server_args.prepare_server_args``. Every one of SGLang's options is
registered, in SGLang's order, so unknown and ambiguous flags fail the same way
(exit status 2 with argparse's message). The simulator acts on a few of them;
the rest are accepted and only shown in the ``server_args=`` line.
"""

from __future__ import annotations

import argparse
import re
import sys
from decimal import Decimal

from ._flag_table import FLAGS

PROG = "sglang serve"

# Defaults of the options the simulator reads (SGLang's declared defaults).
DEFAULTS = {
    "tp_size": 1,
    "host": "127.0.0.1",
    "port": 30000,
    "watchdog_timeout": 300,
    "max_prefill_tokens": 16384,
    "schedule_policy": "fcfs",
    "kv_cache_dtype": "auto",
    "log_level": "info",
    "served_model_name": None,
    "mem_fraction_static": None,
    "chunked_prefill_size": None,
    "context_length": None,
}


def human_readable_int(value: str) -> int:
    """SGLang's integer parser: 1k -> 1000, 1Ki -> 1024 (suffixes case-sensitive)."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


_TYPES = {"int": int, "float": float, "hint": human_readable_int, "str": str, None: None}


class DeprecatedStoreTrueAction(argparse.Action):
    """A retired boolean that still stores True and warns (SGLang's class of that name)."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kw):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        DEPRECATION_WARNINGS.append(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """A retired valued flag whose one value became a boolean."""

    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kw):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        DEPRECATION_WARNINGS.append(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, self.const_value)


# Filled while parsing, logged by the launcher once logging is set up.
DEPRECATION_WARNINGS: list[str] = []

_NEW_FLAGS = {
    "disable_cuda_graph": "--cuda-graph-backend-{decode,prefill}=disabled",
    "enable_dp_attention": "--attn-dp-size",
    "enable_amd_monokernel": "--enable-amd-monokernel",
}


def build_parser() -> argparse.ArgumentParser:
    """The launcher's parser: same options, types, choices, prog and abbreviation rules."""
    parser = argparse.ArgumentParser(prog=PROG)
    for opts, dest, kind, typ, nargs, choices in FLAGS:
        kw: dict = {"dest": dest}
        if kind == "store":
            kw["type"] = _TYPES[typ]
            if nargs is not None:
                kw["nargs"] = nargs
            if choices:
                kw["choices"] = list(choices)
            kw["default"] = DEFAULTS.get(dest)
            if dest == "model_path":
                kw["required"] = True
        elif kind == "store_true":
            kw["action"] = "store_true"
        elif kind == "bool_optional":
            kw["action"] = argparse.BooleanOptionalAction
            kw["default"] = None
        elif kind == "deprecated_true":
            kw["action"] = DeprecatedStoreTrueAction
            kw["new_flag"] = _NEW_FLAGS.get(dest)
        elif kind == "deprecated_const":
            kw["action"] = DeprecatedStoreConstAction
            kw["nargs"] = nargs
            kw["choices"] = list(choices) if choices else None
            kw["const_value"] = True
            kw["default"] = False
            kw["new_flag"] = _NEW_FLAGS.get(dest)
        else:  # pragma: no cover - table is generated
            raise AssertionError(kind)
        parser.add_argument(*opts, **kw)
    return parser


def merge_config_file(argv: list[str]) -> list[str]:
    """`--config FILE.yaml` as SGLang's ServerArgsConfigParser handles it: the file's keys become
    flags placed before the other arguments (so the command line wins). Used for the API key."""
    if "--config" not in argv:
        return argv
    import yaml  # only needed with --config (python3-yaml in the lab image)

    at = argv.index("--config")
    if at == len(argv) - 1:
        raise SystemExit("No config file specified after --config flag!")
    with open(argv[at + 1]) as handle:
        config = yaml.safe_load(handle) or {}
    from_file: list[str] = []
    for key, value in config.items():
        if value is True:
            from_file.append(f"--{key}")
        elif isinstance(value, list):
            from_file += [f"--{key}", *map(str, value)] if value else []
        elif value is not False:
            from_file += [f"--{key}", str(value)]
    return from_file + argv[:at] + argv[at + 2:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like SGLang: argparse errors print usage and exit with status 2."""
    DEPRECATION_WARNINGS.clear()
    return build_parser().parse_args(merge_config_file(sys.argv[1:] if argv is None else argv))
