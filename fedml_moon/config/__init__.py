"""The run's configuration: its typed sections (`schema`), how a section is built from YAML and `--set`
values (`fields`), the one validated `Config` of a run (`load`), the digests of the files its settings
name (`files`), the checks of buffered aggregation against the rest (`buffered`) and the reference
generated from the code (`reference`). Importing this package imports none of them."""
