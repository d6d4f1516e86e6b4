// Charts drawn in the browser with uPlot (canvas): hover for values, click a legend entry to
// hide its series, drag to zoom. The API's PNG/SVG charts stay for reports and the CLI.
import uPlot from 'uplot';
import { useEffect, useRef } from 'preact/hooks';

export const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777'];

/**
 * x: numbers; series: [{label, values, color?, bars?, points?}]; xLabels: names for x positions
 * (categories); yLabel and format(y) for the axis.
 */
export function Chart({ title, x, series, xLabels, xLabel, yLabel, format, height = 260, log = false, testid }) {
  const box = useRef(null);
  useEffect(() => {
    const el = box.current;
    if (!el || !x.length) return undefined;
    const categories = Boolean(xLabels);
    const opts = {
      title,
      width: Math.max(280, el.clientWidth),
      height,
      scales: {
        x: { time: false, ...(categories ? { range: [-0.5, x.length - 0.5] } : {}) },
        y: log ? { distr: 3 } : {},
      },
      axes: [
        {
          label: xLabel,
          ...(categories ? { values: (u, splits) => splits.map((s) => (Number.isInteger(s) ? xLabels[s] || '' : '')) } : {}),
          ...(categories ? { splits: () => x.map((_, i) => i) } : {}),
        },
        { label: yLabel, size: 70, values: (u, splits) => splits.map((v) => (format ? format(v) : v)) },
      ],
      series: [
        { label: xLabel || 'x', value: (u, v) => (v === null || v === undefined ? '–' : categories ? xLabels[v] : v) },
        ...series.map((s, i) => ({
          label: s.label,
          stroke: s.color || PALETTE[i % PALETTE.length],
          fill: s.bars ? (s.color || PALETTE[i % PALETTE.length]) + '99' : undefined,
          width: s.bars ? 0 : 2,
          spanGaps: false,
          points: s.bars ? { show: false } : { show: true, size: 7 },
          paths: s.bars ? uPlot.paths.bars({ size: [0.6 / series.filter((t) => t.bars).length, 64], align: 0 }) : undefined,
          value: (u, v) => (v === null || v === undefined ? '–' : format ? format(v) : v),
        })),
      ],
    };
    const plot = new uPlot(opts, [x, ...series.map((s) => s.values)], el);
    const resize = new ResizeObserver(() => plot.setSize({ width: Math.max(280, el.clientWidth), height }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      plot.destroy();
    };
  }, [JSON.stringify([title, x, series, xLabels, height, log])]);
  return <div class="chart" ref={box} data-chart={testid || title} data-series={series.map((s) => s.label).join('|')} />;
}
