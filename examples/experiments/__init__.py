"""The paper's design choices put to the test. Run one from the repository root as a module, e.g.
`python -m examples.experiments.masking_width --help`: it imports the examples' shared code as `examples.helpers`."""
