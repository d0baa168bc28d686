# Sourced by the experiment scripts. `ended DIR` is true when DIR holds a run that ended (its summary.json
# says completed or diverged; distfl.report.ended): such a run is skipped. A run that was stopped, killed
# or failed also leaves a summary.json (status stopped, running or failed) and is run again.
ended() {
  python -c 'import sys; from distfl.report import ended; sys.exit(0 if ended(sys.argv[1]) else 1)' "$1"
}
