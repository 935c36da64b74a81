"""Side-by-side measurements against the peers. Run one from the repository root as a module, e.g.
`python -m benchmarks.bench_train --help`: the repository root is then the import root, where the benchmarks, the
examples' shared code (`examples.helpers`) and the tests find each other."""
