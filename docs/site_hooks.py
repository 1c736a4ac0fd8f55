"""MkDocs hook (mkdocs.yml `hooks:`): the study outputs under docs/study/ and docs/probes/ are
written by `normlab study`, which links every plot and compare.md it wrote; only some of them are
committed. On those pages a link to a file that is not in docs/ becomes its text and
"(not committed)", so that `mkdocs build --strict` still fails on any other broken link."""

from __future__ import annotations

import posixpath
import re
from typing import Any

TOOL_OUTPUTS = ("study/", "probes/")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s#]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    if not src.startswith(TOOL_OUTPUTS):
        return markdown
    here = posixpath.dirname(src)

    def keep(m: re.Match[str]) -> str:
        image, text, target = m.groups()
        if "://" in target or files.get_file_from_path(posixpath.join(here, target)) is not None:
            return m.group(0)
        return (
            f"{text or target} ({target}: not committed)"
            if not image
            else f"*{text} ({target}: not committed)*"
        )

    return LINK.sub(keep, markdown)
