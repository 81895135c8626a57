#!/bin/sh
# One-shot: wait for the namespace, then register aiworker's Keyword search
# attributes. Idempotent: an attribute that already exists is not an error.
set -eu
ns="${TEMPORAL_NAMESPACE:-default}"
i=0
until temporal operator namespace describe --namespace "$ns" >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -ge 60 ]; then
    echo "namespace $ns not ready after 120s" >&2
    exit 1
  fi
  sleep 2
done
for name in AiworkerStatus AiworkerTenant AiworkerPipeline AiworkerErrorCode; do
  if temporal operator search-attribute list --namespace "$ns" | grep -qw "$name"; then
    echo "search attribute $name exists"
  else
    temporal operator search-attribute create --namespace "$ns" --name "$name" --type Keyword
  fi
done
