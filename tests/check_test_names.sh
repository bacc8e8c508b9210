#!/bin/sh
# Fails when a Catch test name holds a ';': CTest's discovery splits such a name into two tests
# whose filters match nothing, so the test would silently never run. Arguments: test binaries.
status=0
for binary in "$@"; do
  bad=$("$binary" --list-test-names-only | grep ';')
  if [ -n "$bad" ]; then
    echo "$binary: test names with ';' (CTest would run nothing for them):"
    echo "$bad"
    status=1
  fi
done
exit $status
