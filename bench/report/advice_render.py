"""The advice alone (`gpubox advise --format md|html|latex`), through the same templates and escaping
as the report's advice section (templates/_advice.*.j2)."""

from __future__ import annotations

from .markdown import html_environment, md_environment

TEMPLATE = {"md": "advice.md.j2", "html": "advice.html.j2", "latex": "advice.tex.j2"}


def render(advices: list, fmt: str, title: str) -> str:
    from . import latex

    env = {"md": md_environment, "html": html_environment, "latex": latex.environment}[fmt]()
    return env.get_template(TEMPLATE[fmt]).render(advices=advices, multi=len(advices) > 1, title=title)
