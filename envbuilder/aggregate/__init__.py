"""Making the compatibility lockfile: what ``envbuilder lock`` and the GPU matrix's
aggregate job do with results files.

`results` reads and checks results files (schema, suite version, the lock they ran on),
`claims` checks that a run's environment is the one its combination names, and `merge`
folds runs, the previous lockfile's evidence and retired rows into a new document. The
document itself and its rules live in `envbuilder.lockfile`; nothing here is imported on
a consumer's machine.
"""
