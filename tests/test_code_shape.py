"""The package's shape, read with ``ast``: no function over MAX_FUNCTION_LINES lines of code, and no
import cycle among impactrl's modules (function-level and relative imports included)."""

import ast
import io
import tokenize
from pathlib import Path


PACKAGE = Path(__file__).resolve().parent.parent / "impactrl"
MAX_FUNCTION_LINES = 60
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def sources() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def code_lines(source: str) -> set[int]:
    """The lines that hold code: any token but comments and line ends (a string over several lines
    holds code on each of them)."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every docstring: a module's, a class's or a function's."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, *FUNCTIONS)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def function_lengths(path: Path, source: str) -> list[tuple[str, int]]:
    """``(where, lines of code)`` of each function and method of a file, nested ones too (whose lines
    also count in the function around them), from its ``def`` line to its last line."""
    tree = ast.parse(source)
    code = code_lines(source) - docstring_lines(tree)
    lengths = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS):
                name = f"{prefix}{child.name}"
                lengths.append((f"{path.relative_to(PACKAGE.parent)}:{child.lineno} {name}",
                                len(code & set(range(child.lineno, child.end_lineno + 1)))))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return lengths


def test_the_line_counter_skips_docstrings_comments_and_blank_lines():
    source = '''
def f(x):
    """A docstring
    over lines."""
    # a comment

    y = """a string
    that is code"""
    return (x +  # a comment after code
            y)
'''
    assert function_lengths(PACKAGE / "example.py", source) == [("impactrl/example.py:2 f", 5)]


def test_no_function_is_longer_than_60_lines_of_code():
    too_long = [f"{where}: {lines} lines" for path, source in sources().items()
                for where, lines in function_lengths(path, source) if lines > MAX_FUNCTION_LINES]
    assert not too_long, (f"{len(too_long)} functions over {MAX_FUNCTION_LINES} lines of code (docstrings, comments "
                          "and blank lines not counted):\n" + "\n".join(too_long))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, is_package: bool, tree: ast.AST, modules: set[str]) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of one of ``modules`` anywhere in a module's ``tree``:
    at its top, in functions, under ``if TYPE_CHECKING``, absolute or relative. ``from a import b``
    imports the submodule ``a.b`` when there is one, else ``a``."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` where c is a name: module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {module it imports: the first line that imports it}, over impactrl's modules."""
    files = sources()
    modules = {module_name(path) for path in files}
    graph = {}
    for path, source in files.items():
        name = module_name(path)
        edges = graph.setdefault(name, {})
        for target, line in imported_modules(name, path.name == "__init__.py", ast.parse(source), modules):
            edges.setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (the import cycles)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def test_the_import_graph_reads_every_kind_of_import():
    source = "from . import b\nfrom .c import name\nimport impactrl.d.e\ndef f():\n    from ..x import y\n"
    modules = {"impactrl", "impactrl.p", "impactrl.p.a", "impactrl.p.b", "impactrl.p.c", "impactrl.d", "impactrl.d.e",
               "impactrl.x", "impactrl.x.y"}
    found = imported_modules("impactrl.p.a", False, ast.parse(source), modules)
    assert found == [("impactrl.p.b", 1), ("impactrl.p.c", 2), ("impactrl.d.e", 3), ("impactrl.x.y", 5)]
    graph = {"a": {"b": 1}, "b": {"c": 1, "a": 2}, "c": {"d": 1}, "d": {"c": 1}, "e": {"a": 1}}
    assert strongly_connected(graph) == [["a", "b"], ["c", "d"]]


def test_no_import_cycle_among_impactrls_modules():
    graph = import_graph()
    assert len(graph) > 30 and "impactrl.config" in graph["impactrl.training"]  # it reads the package
    cycles = strongly_connected(graph)
    described = []
    for cycle in cycles:
        edges = [f"{source} imports {target} (line {graph[source][target]})"
                 for source in cycle for target in cycle if target in graph[source]]
        described.append(" <-> ".join(cycle) + ":\n    " + "\n    ".join(edges))
    assert not cycles, f"{len(cycles)} import cycles among impactrl's modules:\n" + "\n".join(described)
