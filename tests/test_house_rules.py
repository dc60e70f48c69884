"""Rules of the house that import-linter cannot check: module-level state is rare, named, and never keyed by a job;
modules and functions stay small enough to read; no module of the tests imports a test module.

A job's state flows down as values (``StepInput``, the job record); what a process may keep at module level is
listed here with what it is keyed by. A new module-level mutable (a dict, list, set, ... assigned at module or
class level under a lower-case name) fails this test until it is added with its key, so a registry keyed by the
job directory cannot come back unseen. UPPER_CASE names are constant tables and must not be mutated.
"""

from __future__ import annotations

import ast
import functools
import re

from tests.conftest import REPO_ROOT

PACKAGES = ("config", "tasks", "flows", "deployments")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 50
MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "defaultdict",
    "OrderedDict",
    "deque",
    "Counter",
    "WeakValueDictionary",
    "KeptByDigest",
}
MUTATING_METHODS = {"append", "add", "update", "pop", "clear", "setdefault", "extend", "insert", "remove", "discard"}

# module:name -> what it is keyed by (never a job)
ALLOWED_STATE = {
    "tasks.clients.auth:_token_sources": "OAuth issuer, client id and a digest of the client secret",
    "tasks.pseudonymizer:_configs_by_digest": "the digest of the anonymization file's bytes",
    "tasks.job.flattening_plan:_plans": "the digest of the flattening step's views (its CRTDL and lookup file)",
    "tasks.core.redaction:_secrets": "the configured secret values themselves: the redaction's registry",
    "flows.heartbeats:_ensured_on": "the Prefect API URL that holds the crash automation",
    "flows.run_logging:_traced": "a failure's exception type and text (the last 64; a flow run's start clears it)",
}


def modules() -> list[tuple[str, ast.Module]]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
            found.append((name, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return found


def is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        function = value.func
        name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
        return name in MUTABLE_CALLS
    return False


@functools.cache
def model_classes() -> frozenset[str]:
    """The names of the packages' pydantic models: classes with BaseModel among their bases' bases."""
    bases = {
        node.name: {ast.unparse(base) for base in node.bases}
        for _, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    models = {"BaseModel"}
    while grown := {name for name, of in bases.items() if of & models} - models:
        models |= grown
    return frozenset(models)


def is_model_field(node: ast.stmt, in_model: bool) -> bool:
    """A pydantic model's field: its default is copied for each instance (a ClassVar is not)."""
    return in_model and isinstance(node, ast.AnnAssign) and "ClassVar" not in ast.unparse(node.annotation)


def module_level_mutables(tree: ast.Module) -> list[str]:
    """Names bound to a mutable container at module level or in a class body (a ClassVar registry counts).

    Note: a pydantic model's field is not: pydantic copies its default for each instance.
    """
    models = model_classes()
    bodies = [(tree.body, False)] + [
        (node.body, node.name in models) for node in tree.body if isinstance(node, ast.ClassDef)
    ]
    names = []
    for body, in_model in bodies:
        for node in body:
            if is_model_field(node, in_model):
                continue
            if isinstance(node, ast.Assign | ast.AnnAssign) and is_mutable(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names += [target.id for target in targets if isinstance(target, ast.Name)]
    return names


def mutated_names(tree: ast.Module) -> set[str]:
    """Names whose item is assigned or deleted, or on which a mutating method is called, anywhere in the module."""
    mutated = set()
    for node in ast.walk(tree):
        stored = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del)
        if stored and isinstance(node.value, ast.Name):
            mutated.add(node.value.id)
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if called and node.func.attr in MUTATING_METHODS and isinstance(node.func.value, ast.Name):
            mutated.add(node.func.value.id)
    return mutated


def test_module_level_state_is_only_the_listed_caches_none_keyed_by_a_job():
    state = {
        f"{module}:{name}"
        for module, tree in modules()
        for name in module_level_mutables(tree)
        if name != "__all__" and not name.isupper()
    }
    assert state == set(ALLOWED_STATE), (
        "module-level state changed: a new entry needs its key in ALLOWED_STATE (never the job directory); "
        "a job's state flows down as values"
    )


def test_upper_case_tables_are_never_mutated():
    mutated = {
        f"{module}:{name}"
        for module, tree in modules()
        for name in set(module_level_mutables(tree)) & mutated_names(tree)
        if name.isupper()
    }
    assert not mutated, f"constant tables mutated at run time: {sorted(mutated)}"


def exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Every exception class of the packages, by name: its module and the names of its bases."""
    classes = {}
    for module, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (module, [ast.unparse(base) for base in node.bases])
    known = {"Exception", "ValueError", "OSError", "yaml.MarkedYAMLError"}
    exceptions: dict[str, tuple[str, list[str]]] = {}
    changed = True
    while changed:  # a class is an exception when one of its bases is
        changed = False
        for name, (module, bases) in classes.items():
            if name not in exceptions and any(base in known or base in exceptions for base in bases):
                exceptions[name] = (module, bases)
                changed = True
    return exceptions


def drawn_names(docstring: str) -> set[str]:
    """The words of a docstring's drawings: its literal blocks, each after a line ending in ``::``."""
    words: set[str] = set()
    block_indent = None
    for line in docstring.splitlines():
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and line.strip() and indent <= block_indent:
            block_indent = None
        if block_indent is not None:
            words |= set(re.findall(r"\w+", line))
        elif line.rstrip().endswith("::"):
            block_indent = indent
    return words


def layer_drawing(module: str, drawings: dict[str, set[str]]) -> str:
    """Where the classes of ``module`` are drawn: its package's ``errors`` module, else the package."""
    package = module.rpartition(".")[0]
    errors = f"{package}.errors"
    home = errors if errors in drawings else package
    return home


def ancestors(name: str, exceptions: dict[str, tuple[str, list[str]]]) -> set[str]:
    bases = {base for base in exceptions[name][1] if base in exceptions}
    return bases.union(*(ancestors(base, exceptions) for base in bases))


def test_each_exception_is_drawn_once_in_its_layers_drawing_under_one_root():
    import tasks.core.errors

    exceptions = exception_classes()
    drawings = {module: drawn_names(ast.get_docstring(tree) or "") for module, tree in modules()}
    tree = {name for name in exceptions if "DupflowError" in ancestors(name, exceptions) | {name}}
    home = {name: layer_drawing(exceptions[name][0], drawings) for name in tree}
    undrawn = sorted(f"{name} in {home[name]}" for name in tree if name not in drawings[home[name]])
    assert not undrawn, f"draw each class in its layer's module docstring (after '::'): {undrawn}"
    strays = sorted(
        f"{name} in {module}"
        for module, drawn in drawings.items()
        for name in drawn & tree
        if module != home[name]
        and not any(home[child] == module and name in ancestors(child, exceptions) for child in drawn & tree)
    )
    assert not strays, f"drawn outside its layer (only the parents its layer hangs from may be): {strays}"
    layers = set(home.values()) - {"tasks.core.errors"}
    named = set(re.findall(r"``([\w.]+)``", tasks.core.errors.__doc__ or ""))
    assert layers <= named, f"name where each layer is drawn in tasks.core.errors: {sorted(layers - named)}"
    roots = sorted(name for name, (_, bases) in exceptions.items() if not set(bases) & set(exceptions))
    outside = ["Cancelled", "_DuplicateKeyError", "_InputWanted", "_UnusableBlock"]
    assert roots == sorted(["DupflowError", *outside]), "one root, DupflowError (or add it below)"
    assert set(outside) <= set(re.findall(r"\w+", tasks.core.errors.__doc__ or "")), (
        "name the control-flow exceptions outside the tree in tasks.core.errors"
    )


def test_modules_stay_under_500_lines_and_functions_under_50():
    too_long = []
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_MODULE_LINES:
                too_long.append(f"{path.relative_to(REPO_ROOT)}: {lines} lines")
    for name, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, "split by responsibility: " + "; ".join(too_long)


def imported_modules(tree: ast.Module, package: str) -> set[str]:
    """Every module (or module of a package) ``tree`` may import, relative imports made absolute."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def test_no_module_of_the_tests_imports_a_test_module():
    """Shared helpers live in ``tests/support/``: a test module imported by another is one its tests lean on."""
    paths = sorted((REPO_ROOT / "tests").rglob("*.py"))
    dotted = {path: ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts) for path in paths}
    test_modules = {name for path, name in dotted.items() if path.name.startswith("test_")}
    importing = []
    for path, name in dotted.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name.rpartition(".")[0] if path.name != "__init__.py" else name.removesuffix(".__init__")
        importing += [f"{name} imports {found}" for found in sorted(imported_modules(tree, package) & test_modules)]
    assert not importing, "move what they share into tests/support/: " + "; ".join(importing)
