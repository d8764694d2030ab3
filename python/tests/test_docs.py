"""The package's documentation keeps up with it: every public function,
class and method is in man/aft.1's PYTHON section, the calls a user starts
from are in README.md's Python section, and help() has a docstring for each
(test_package checks the docstrings)."""

import os
import re
import unittest

from common import ROOT, aft

# public names that are data, not calls
NOT_CALLS = {"API_VERSION", "library_path", "Tensors"}


def section(path, start, end):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    m = re.search(start + r"(.*?)" + end, text, re.S)
    if not m:
        raise AssertionError("%s: no section %r" % (path, start))
    return m.group(1).replace("\\-", "-").replace("\\fI", "").replace("\\fR", "")


def methods(cls):
    return [m for m, f in vars(cls).items()
            if not m.startswith("_") and (callable(f) or isinstance(f, (classmethod, property)))]


class Docs(unittest.TestCase):
    def test_man_page(self):
        man = section("man/aft.1", r"\n\.SH PYTHON\n", r"\n\.SH ")
        for name in aft.__all__:
            if name in NOT_CALLS:
                continue
            self.assertIn("aft." + name, man, "man/aft.1's PYTHON section lacks aft.%s" % name)
        for cls in (aft.Layer, aft.State, aft.Model):
            for m in methods(cls):
                if m in ("close", "position"):
                    continue  # housekeeping: the docstrings have them
                self.assertIn("." + m + "(", man, "man/aft.1 lacks %s.%s" % (cls.__name__, m))
        self.assertIn("AFT_LIBRARY", man)

    def test_readme(self):
        readme = section("README.md", r"\n## Python\n", r"\n## ")
        for name in ("load", "save", "Layer", "State", "op", "op_backward", "Model", "levels", "level",
                     "use_level"):
            self.assertIn("aft." + name, readme, "README.md's Python section lacks aft.%s" % name)
        for m in ("forward", "backward", "stream", "step", "save", "logits", "generate", "encode", "decode"):
            self.assertIn("." + m, readme, "README.md's Python section lacks .%s" % m)


if __name__ == "__main__":
    unittest.main()
