#!/usr/bin/env bash
# Sets up self-hosted GPU runners for the GPU matrix so that code from a fork cannot reach
# them (README: "Running the GPU matrix on GitHub Actions", runner safety). Run it as a
# repository (and organization) admin, with gh logged in or GH_TOKEN set.
#
#   scripts/setup-gpu-runner.sh group OWNER/REPO [GROUP]
#       Organization repositories: create (or update) the runner group GROUP (default
#       gpu-matrix), open to OWNER/REPO only and restricted to the workflow
#       .github/workflows/gpu-matrix.yml on the repository's default branch. Prints its id.
#   scripts/setup-gpu-runner.sh approval OWNER/REPO
#       Require approval before any workflow run of an outside collaborator's pull request.
#   scripts/setup-gpu-runner.sh run OWNER/REPO RUNNER_DIR [GROUP] [LABELS]
#       On the GPU machine: register an ephemeral just-in-time runner (LABELS, default
#       self-hosted,linux,x64,gpu) in GROUP, run one job with RUNNER_DIR/run.sh (the
#       unpacked actions/runner release), and repeat with a fresh runner for the next job.
#       Without GROUP (repositories owned by a user) the runner joins the repository.
#       GPU_RUNNER_JOBS=N stops after N jobs.
#
# The token of `run` needs the "Self-hosted runners" organization permission (write), or
# the repository's "Administration" permission (write) without GROUP; keep it on the
# GPU machine only, outside the runner's work directory.
set -euo pipefail

WORKFLOW=.github/workflows/gpu-matrix.yml

die() {
  echo "setup-gpu-runner: $*" >&2
  exit 2
}

usage() {
  sed -n '6,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

check_repo() {
  [[ $1 =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]] || die "expected OWNER/REPO, got '$1'"
}

owner_is_organization() {
  [ "$(gh api "users/${1%%/*}" --jq .type)" = Organization ]
}

group_id() {  # ORG NAME -> the id of the organization's runner group NAME, or nothing
  gh api --paginate "orgs/$1/actions/runner-groups" \
    --jq ".runner_groups[] | select(.name == \"$2\") | .id"
}

cmd_group() {
  local repo=$1 name=${2:-gpu-matrix}
  check_repo "$repo"
  local org=${repo%%/*}
  owner_is_organization "$repo" || die "$org is not an organization: runner groups need one." \
    "Use a private repository, or move it to an organization (README: runner safety)."
  local branch repo_id public workflow
  branch=$(gh api "repos/$repo" --jq .default_branch)
  repo_id=$(gh api "repos/$repo" --jq .id)
  public=$(gh api "repos/$repo" --jq 'if .private then "false" else "true" end')
  workflow="$repo/$WORKFLOW@refs/heads/$branch"
  local settings=(
    -f visibility=selected
    -F restricted_to_workflows=true
    -f "selected_workflows[]=$workflow"
    # a public repository's jobs reach the group only when this is true
    -F "allows_public_repositories=$public"
  )
  local id
  id=$(group_id "$org" "$name")
  if [ -z "$id" ]; then
    id=$(gh api -X POST "orgs/$org/actions/runner-groups" -f "name=$name" "${settings[@]}" \
      -F "selected_repository_ids[]=$repo_id" --jq .id)
    echo "created runner group $name (id $id)" >&2
  else
    gh api -X PATCH "orgs/$org/actions/runner-groups/$id" "${settings[@]}" --silent
    gh api -X PUT "orgs/$org/actions/runner-groups/$id/repositories" \
      -F "selected_repository_ids[]=$repo_id" --silent
    echo "updated runner group $name (id $id)" >&2
  fi
  echo "runner group $name: repository $repo only, workflow $workflow only" >&2
  printf '%s\n' "$id"
}

cmd_approval() {
  local repo=$1
  check_repo "$repo"
  gh api -X PUT "repos/$repo/actions/permissions/fork-pr-contributor-approval" \
    -f approval_policy=all_external_contributors --silent
  echo "$repo: workflow runs of outside collaborators' pull requests wait for approval" >&2
}

cmd_run() {
  local repo=$1 runner_dir=$2 group=${3:-} labels=${4:-self-hosted,linux,x64,gpu}
  check_repo "$repo"
  [ -x "$runner_dir/run.sh" ] || die "$runner_dir/run.sh not found: unpack the actions/runner release there"
  local endpoint group_number
  if [ -n "$group" ]; then
    group_number=$(group_id "${repo%%/*}" "$group")
    [ -n "$group_number" ] || die "no runner group '$group' in ${repo%%/*}: run '$0 group $repo $group' first"
    endpoint="orgs/${repo%%/*}/actions/runners/generate-jitconfig"
  else
    group_number=1  # a repository's runners are in its default group
    endpoint="repos/$repo/actions/runners/generate-jitconfig"
  fi
  local label_args=() label split
  IFS=, read -ra split <<<"$labels"
  for label in "${split[@]}"; do
    label_args+=(-f "labels[]=$label")
  done
  local done_jobs=0 config
  while [ -z "${GPU_RUNNER_JOBS:-}" ] || [ "$done_jobs" -lt "$GPU_RUNNER_JOBS" ]; do
    # A just-in-time runner takes one job and is then removed: the next job gets a new one.
    config=$(gh api -X POST "$endpoint" -f "name=$(hostname)-$(date -u +%Y%m%d%H%M%S)-$$-$done_jobs" \
      -F "runner_group_id=$group_number" "${label_args[@]}" -f work_folder=_work \
      --jq .encoded_jit_config)
    "$runner_dir/run.sh" --jitconfig "$config"
    done_jobs=$((done_jobs + 1))
  done
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  group) if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi; cmd_group "$@" ;;
  approval) if [ $# -ne 1 ]; then usage; fi; cmd_approval "$@" ;;
  run) if [ $# -lt 2 ] || [ $# -gt 4 ]; then usage; fi; cmd_run "$@" ;;
  *) usage ;;
esac
