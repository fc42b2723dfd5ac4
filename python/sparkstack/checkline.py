"""One check as one line, `pass  name: detail`: how preflight and verify print what they checked."""


def check_line(status: str, name: str, detail: str, where: str = "") -> str:
    """`status` is pass, warn, fail or skip; `where` an optional prefix such as `[rank 1] `."""
    return f"{status:<4}  {where}{name}: {detail}"
