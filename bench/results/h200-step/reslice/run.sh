set -x
# OLD_CLIENT: the client/python of the commit before (git archive 969941b client/python).
source bench/results/h200-step/overlap/env.sh
export B=$b
o2=$o/reslice; mkdir -p $o2
nvidia-smi -L > $o2/gpu.txt
T=bench/results/h200-step/python-client/trainloop.py
for r in 1 2; do
  CLIENT=$OLD_CLIENT MODES=reslice,fixed N=400 timeout 70 python3 $T > $o2/old-$r.txt 2>&1; echo "rc=$?" >> $o2/old-$r.txt
  MODES=reslice,fixed N=400 timeout 70 python3 $T > $o2/new-$r.txt 2>&1; echo "rc=$?" >> $o2/new-$r.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
