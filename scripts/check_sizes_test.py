#!/usr/bin/env python3
"""Tests scripts/check-sizes.py's scanners on small snippets, and that its temporary lists only
shrink.

  python3 scripts/check_sizes_test.py"""
import importlib.util
import os
import unittest

_spec = importlib.util.spec_from_file_location(
    "check_sizes", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-sizes.py"))
sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sizes)


def body(lines):
    """A body of `lines` statements, one a line."""
    return "".join(f"  x += {k};\n" for k in range(lines))


class CppTest(unittest.TestCase):
    def found(self, text):
        return sizes.cpp_functions(text)

    def test_namespaces_and_extern_c_are_see_through(self):
        text = ('namespace crun {\nnamespace {\nint A() {\n  return 1;\n}\n}  // namespace\n'
                'extern "C" {\nvoid B(void) {}\n}\n}  // namespace crun\n')
        self.assertEqual(self.found(text), [("A", 3, 5), ("B", 8, 8)])

    def test_inline_methods_and_nested_classes(self):
        text = ("class Engine final : public Base {\n public:\n  int Size() const { return n_; }\n"
                "  struct Inner {\n    void Run() noexcept override {\n    }\n  };\n"
                " private:\n  int n_ = 0;\n};\n")
        self.assertEqual(self.found(text), [("Engine::Size", 3, 3), ("Engine::Inner::Run", 5, 6)])

    def test_out_of_line_method_counts_from_its_name(self):
        text = ("template <typename T>\nstd::vector<int>\nEngine<T>::OnJoin(int a,\n"
                "                  int b) const -> int {\n" + body(3) + "}\n")
        self.assertEqual(self.found(text), [("Engine::OnJoin", 3, 8)])

    def test_constructor_with_initializers(self):
        text = ("AgentMetrics::AgentMetrics(Registry& r)\n    : a_(r),\n      b_{1, {2}},\n"
                "      c_(Make(r)) {\n  Start();\n}\nFoo::~Foo() {}\n")
        self.assertEqual(self.found(text), [("AgentMetrics::AgentMetrics", 1, 6),
                                            ("Foo::~Foo", 7, 7)])

    def test_lambdas_and_blocks_count_toward_their_function(self):
        text = ("void Drain() {\n  auto f = [&](int x) mutable {\n    if (x) {\n    }\n  };\n"
                "  { f(1); }\n}\n")
        self.assertEqual(self.found(text), [("Drain", 1, 7)])

    def test_literals_and_comments_hide_their_braces(self):
        text = ('const char* kScript = R"py(\ndef f():\n    return {"}": 1}\n)py";\n'
                "// void Fake() {\n/* int Other() { */\nchar Open() { return '{'; }\n"
                'const char* Close() { return "}\\"{"; }\n#define BRACE {\n')
        self.assertEqual(self.found(text), [("Open", 7, 7), ("Close", 8, 8)])

    def test_initializers_are_not_functions(self):
        text = ("struct Point {\n  int x, y;\n} origin = {0, 0};\nint kTable[] = {1, 2};\n"
                "const Options kDefault{Make(1), {2}};\nauto kLambda = [](int x) {\n"
                "  return x;\n};\nenum class Kind : int { kA, kB };\n"
                "std::function<void(int)> cb_{nullptr};\nvoid Real() {}\n")
        self.assertEqual(self.found(text), [("Real", 11, 11)])

    def test_operators_qualifiers_and_macros(self):
        text = ("bool Id::operator==(const Id& o) const { return v == o.v; }\n"
                "int Sum::operator()(int a) { return a; }\n"
                "void Run() ABSL_LOCKS_EXCLUDED(mu_) [[gnu::cold]] {}\n")
        self.assertEqual(self.found(text), [("Id::operator==", 1, 1),
                                            ("Sum::operator()", 2, 2), ("Run", 3, 3)])

    def test_function_try_block(self):
        text = "Conn::Conn(int fd) try : fd_(fd) {\n} catch (...) {\n  Close();\n}\n"
        self.assertEqual(self.found(text), [("Conn::Conn", 1, 4)])

    def test_unbalanced_braces_are_reported(self):
        with self.assertRaises(ValueError):
            self.found("void F() {\n")


class PyTest(unittest.TestCase):
    def test_functions_methods_and_nested_ones(self):
        text = ("import os\n\n\n@decorated\ndef load(timeout=300):\n    def inner():\n"
                "        return 1\n    return inner()\n\n\nclass Store:\n"
                "    async def save(self):\n        pass\n")
        self.assertEqual(sizes.py_functions(text, "crun_worker"),
                         [("crun_worker.load", 5, 8), ("crun_worker.load.inner", 6, 7),
                          ("Store.save", 12, 13)])


class CheckTest(unittest.TestCase):
    LONG = "void Long() {\n" + body(90) + "}\n"  # 92 lines

    def check(self, files, known_over=None, known_long=None):
        return sizes.check(list(files), files.get, known_over or {}, known_long or {})[0]

    def test_offenders_are_named(self):
        errors = self.check({"a/x.cc": self.LONG, "a/y.py": "x = 1\n" * 601})
        self.assertEqual(errors, ["a/x.cc:1: function Long is 92 lines, over the limit of 80",
                                  "a/y.py:1: file is 601 lines, over the limit of 600"])

    def test_local_agent_has_its_own_limit(self):
        errors = self.check({"agent/local_agent.cc": "\n" * 301})
        self.assertEqual(errors, ["agent/local_agent.cc:1: file is 301 lines, over the limit of "
                                  "300"])

    def test_exemptions_and_temporary_entries_pass(self):
        text = self.LONG.replace("Long", "AddLaunchOptions") + self.LONG
        self.assertEqual(self.check({"a/x.cc": text}, known_over={"Long": 92}), [])
        self.assertEqual(self.check({"a/x.cc": "\n" * 700}, known_long={"a/x.cc": 700}), [])

    def test_temporary_entries_within_the_limit_fail(self):
        errors = self.check({"a/x.cc": "void Long() {\n}\n"}, known_over={"Long": 92})
        self.assertEqual(len(errors), 1)
        self.assertIn("KNOWN_OVER's Long is 2 lines now", errors[0])
        errors = self.check({"a/x.cc": "\n" * 600}, known_long={"a/x.cc": 700})
        self.assertIn("KNOWN_LONG_FILES's a/x.cc is 600 lines now", errors[0])

    def test_temporary_entries_that_grew_fail(self):
        errors = self.check({"a/x.cc": self.LONG}, known_over={"Long": 85})
        self.assertEqual(len(errors), 1)
        self.assertIn("KNOWN_OVER's Long grew to 92 lines, from 85", errors[0])
        errors = self.check({"a/x.cc": "\n" * 701}, known_long={"a/x.cc": 700})
        self.assertIn("KNOWN_LONG_FILES's a/x.cc grew to 701 lines, from 700", errors[0])

    def test_temporary_entries_that_are_gone_fail(self):
        self.assertEqual(len(self.check({}, known_over={"Gone": 90}, known_long={"a": 700})), 2)


if __name__ == "__main__":
    unittest.main()
