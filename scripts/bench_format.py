"""Formatting helpers of scripts/gen_benchmarks.py and its section modules."""

# The size of the page's headline figures (the judged all_reduce size).
HEADLINE_SIZE = 16 << 20


def num(v, spec=".2f"):
    return "N/A" if v is None else format(v, spec)


def size_text(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def box_of(r):
    """The cluster in a box a result ran on (its "box" object), or None."""
    res = r.get("result")
    if not isinstance(res, dict):
        return None
    if res.get("box"):
        return res["box"]
    return next((c["box"] for c in res.get("collectives", []) if c.get("box")), None)


def box_text(box):
    delay = f", delay {box['delay']}" if box.get("delay") else ""
    # Boxes recorded before the MTU was an option ran at 1500 bytes.
    mtu = f", MTU {box.get('mtu', 1500)}"
    ranks = box.get("ranks_per_host")
    rate = box.get("rate")
    at = "unshaped" if rate == "unshaped" else f"at {rate}"
    return (f"box {box.get('hosts')} hosts x {ranks} rank{'' if ranks == 1 else 's'}, real TCP "
            f"{at}{delay}{mtu}")


def link_text(r):
    if r["kind"] == "box_link":
        return f"{box_text(box_of(r))} / **emulated** `{r['result'].get('emulated_link')}`"
    if box_of(r):
        return box_text(box_of(r))
    return f"**emulated** `{r['emulated']}`" if r["emulated"] else "raw shm"


def table(header, rows):
    out = ["| " + " | ".join(h for h, _ in header) + " |",
           "|" + "|".join("---:" if right else "---" for _, right in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def ratio(a, b):
    return a / b if a is not None and b else None
