"""Reading the user's script (advise/script_ast.py): where a line the whole script needs goes."""

import ast
import textwrap

from bisect_pipeline.advise.script_ast import after_imports


def _at(src: str) -> int:
    return after_imports(ast.parse(textwrap.dedent(src)))


def test_a_line_for_the_whole_script_goes_after_its_first_run_of_imports():
    assert _at('''\
        """Train."""
        from __future__ import annotations
        import torch
        from torchvision import transforms
        x = 1
        import os
    ''') == 5  # after the docstring and the first run of imports, not after a later import
    assert _at('''\
        import sys
        sys.path.insert(0, ".")
        import torch
    ''') == 2
    assert _at('x = 1\nimport torch\nimport os\ny = 2\n') == 4  # what comes before the imports is skipped
    assert _at('"""Only a docstring."""\nx = 1\n') == 2  # nothing imported: after the docstring
    assert _at('x = 1\n') == 1
