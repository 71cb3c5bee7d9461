"""The program that runs inside the sandbox: it loads one candidate program and answers calls.

This file is both a module (the parent imports ``encode`` and ``decode``) and the source of
the sandboxed process (``python -I -S -c <this file>``), so it imports the standard library
only. Nothing here is trusted once the candidate has run: the candidate shares the process
and may rewrite any of it. The design therefore keeps everything worth forging outside:

* the expected results never enter this process; the parent sends only arguments and
  compares the answers itself;
* answers travel as tagged plain data (``encode``) that the parent rebuilds from builtin
  types with its own ``decode``, so an object with a forged ``__eq__`` or ``__bool__`` never
  reaches a comparison;
* each request carries a fresh nonce that its reply must echo, so a reply cannot be
  written ahead of the question; and a test passes only when the parent's own check function
  returns, so exiting early (``exit(0)``, ``os._exit``) ends in a failed check.

Protocol (one JSON object per line): the parent first sends ``{"source", "entry", "nonce",
"limits", "uid"}``; the runner applies the limits, drops to ``uid`` (when started as root),
runs the source and replies ``{"n": nonce, "loaded": bool, "err": str}``. Then each request
``{"n", "args"}`` gets ``{"n", "ok": true, "v": encoded}`` or ``{"n", "ok": false,
"err"}``. End of input ends the process.
"""

import builtins
import json
import os
import resource

# Tags of the plain-data encoding. Ints and floats travel as text: ints may exceed JSON's
# safe range, and repr keeps floats exact (inf and nan included).
_SCALARS = {"n": type(None), "b": bool, "i": int, "f": float, "s": str}
MAX_DEPTH = 64


def encode(value, depth=0):
    """``value`` as nested lists of tags; raises TypeError for anything but builtin data
    (None, bool, int, float, str, list, tuple, set, frozenset, dict)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(value)
    if value is None:
        return ["n"]
    if t is bool:
        return ["b", value]
    if t is int:
        return ["i", str(value)]
    if t is float:
        return ["f", repr(value)]
    if t is str:
        return ["s", value]
    if t in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
        return [tag, [encode(v, depth + 1) for v in value]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"cannot pass a value of type {t.__name__} (only builtin data)")


def decode(obj, depth=0):
    """The value ``encode`` described, built from builtin types only; raises ValueError on
    anything malformed (the input may come from hostile code)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if type(obj) is not list or not obj or type(obj[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = obj[0], obj[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) != 1:
        raise ValueError("malformed value")
    body = rest[0]
    if tag == "b" and type(body) is bool:
        return body
    if tag == "i" and type(body) is str and len(body) <= 4000:
        return int(body)
    if tag == "f" and type(body) is str and len(body) <= 40:
        return float(body)
    if tag == "s" and type(body) is str:
        return body
    if tag in ("l", "t", "S", "F") and type(body) is list:
        items = [decode(v, depth + 1) for v in body]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(body) is list:
        pairs = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed value")
            pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
        return dict(pairs)
    raise ValueError("malformed value")


def _apply_limits(limits, uid):
    # Lower the limits first (allowed without privileges), then give up root: the process
    # count limit counts processes per real user, and a per-sandbox user gives each sandbox
    # its own count (root is exempt from the limit altogether).
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _describe(exc):
    return f"{type(exc).__name__}: {exc}"[:300]


def main():
    reader = os.fdopen(os.dup(0), "r", encoding="utf-8", newline="\n")
    writer = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
    # The candidate's own prints go nowhere; the protocol lives on the duplicated descriptors.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    header = json.loads(reader.readline())
    _apply_limits(header["limits"], header["uid"])

    def reply(message):
        writer.write(json.dumps(message) + "\n")
        writer.flush()

    namespace = {"__name__": "candidate", "__builtins__": builtins}
    try:
        exec(compile(header["source"], "<candidate>", "exec"), namespace)
        fn = namespace.get(header["entry"])
        if not callable(fn):
            raise NameError(f"the program defines no function {header['entry']!r}")
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends count as failures
        reply({"n": header["nonce"], "loaded": False, "err": _describe(exc)})
        return
    reply({"n": header["nonce"], "loaded": True, "err": None})
    for line in reader:
        request = json.loads(line)
        try:
            args = [decode(a) for a in request["args"]]
            value = encode(fn(*args))
        except BaseException as exc:  # noqa: BLE001
            reply({"n": request["n"], "ok": False, "err": _describe(exc)})
            continue
        reply({"n": request["n"], "ok": True, "v": value})


if __name__ == "__main__":
    main()
