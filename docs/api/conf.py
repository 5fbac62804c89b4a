"""Sphinx configuration for the torchssvm API reference (built from the docstrings).

Build it with warnings as errors from the repository root:

    python3 -m pip install -e ".[docs]"
    python3 -m sphinx -W --keep-going -b html docs/api /tmp/torchssvm-api
"""

import os
import re
import sys

import sphinx.ext.napoleon.docstring as _napoleon_docstring

# Autodoc imports the package: no GPU needed, and Triton must not compile anything at import time.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

project = "torchssvm"
author = "torchssvm contributors"
copyright = "torchssvm contributors"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

# The docstrings are plain text with `names` in single backticks and ``code`` in double ones, plus Google-style
# sections ("Args:", "Returns:") in places: render `x` as inline code, not as an (unresolvable) cross-reference.
default_role = "code"
nitpicky = False

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# One field list per section, names in bold: entries such as "unary ``(B, T, K)``, transition ``(K, K)``: ..."
# name several arguments with their shapes, which ":param name:" fields cannot hold.
napoleon_use_param = False
napoleon_use_keyword = False

autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True

root_doc = "index"
exclude_patterns = ["_build"]
templates_path = []
html_theme = "alabaster"
html_static_path = []
html_title = "torchssvm API reference"


# A Google "name (type): ..." entry has a plain name before the parenthesis; in "z ``(B, m)``: ..." the
# parenthesis is a shape inside inline code, so the whole "z ``(B, m)``" is the name (else the literal is cut).
_napoleon_docstring._google_typed_arg_regex = re.compile(r"([^`]+?)\(\s*(.*[^\s]+)\s*\)")

_BOLD_WITH_CODE = re.compile(r"\*\*([^*]*``[^*]*)\*\*")


def _unbold_code_names(app, what, name, obj, options, lines):
    """Napoleon bolds entry names; a name holding ``code`` cannot nest in bold, so leave it plain."""
    lines[:] = [_BOLD_WITH_CODE.sub(r"\1", line) for line in lines]


# "`PoseDataset`s": reST ends interpreted text / inline literals only before a space or punctuation, so a plural
# "s" right after the closing backtick breaks the markup; "\ " (an escaped space) joins them invisibly. Scanned over
# the whole docstring, left to right, so that an inline literal running over a line break stays paired.
_ROLE_OR_LITERAL = re.compile(r"``.+?``|`[^`]+`", re.DOTALL)


def _escape_suffixes(text):
    def suffix(match):
        end = match.end()
        if end < len(text) and (text[end].isalnum() or text[end] == "_"):
            return match.group(0) + "\\ "
        return match.group(0)

    return _ROLE_OR_LITERAL.sub(suffix, text)


_SECTION_HEADER = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns|Raises|Attributes):\s*$")


def _prepare_plain_docstring(app, what, name, obj, options, lines):
    """Before napoleon: make the plain-style docstrings valid Google style / reST without touching their text."""
    lines[:] = _escape_suffixes("\n".join(lines)).split("\n")
    # """Args:\n        x: ...""": the docstring opens with a section header, and dedenting the rest leaves its
    # entries flush with the header; indent them (up to the first blank line) so they belong to the section.
    if lines and _SECTION_HEADER.match(lines[0]):
        for i in range(1, len(lines)):
            if not lines[i].strip():
                break
            lines[i] = "    " + lines[i]


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn adds set_{fit,predict,score}_request methods to every estimator class; their docstrings point
    # into scikit-learn's own documentation (glossary terms, labels) that this build cannot resolve.
    if re.fullmatch(r"set_\w+_request", name):
        return True
    return None


def setup(app):
    # Before napoleon (priority 500).
    app.connect("autodoc-process-docstring", _prepare_plain_docstring, priority=400)
    app.connect("autodoc-skip-member", _skip_member)
    # After napoleon (priority 500), which turns the "Args:" sections into field lists.
    app.connect("autodoc-process-docstring", _unbold_code_names, priority=600)
