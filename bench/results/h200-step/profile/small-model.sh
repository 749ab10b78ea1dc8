set -x
# The train suite model's 16 stored matrices (trainloop.py mode fixed): its step kernels by ncu.
source bench/results/h200-step/overlap/env.sh
export B=$b
MODES=fixed N=60 timeout 200 ncu --clock-control none --target-processes all --kernel-name regex:Step --launch-skip 100 --launch-count 10 --section SpeedOfLight --section LaunchStats --section Occupancy --metrics sm__inst_executed.sum python3 bench/results/h200-step/python-client/trainloop.py > $o/ncu-small.txt 2>&1
cd $OUT && tar czf r.tgz r && rm -rf r
